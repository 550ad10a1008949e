// Package hclogzap adapts a zap logger to hashicorp/go-hclog's Logger interface, so go-plugin's
// own messages and the plugin's stderr lines (which go-plugin parses into hclog records) land in
// the Collector's log with their level and key/value pairs.
package hclogzap

import (
	"fmt"
	"io"
	"log"
	"strings"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// extraValueKey names a trailing value given without a key, as hclog itself does.
const extraValueKey = "EXTRA_VALUE_AT_END"

// Logger is an hclog.Logger writing to a zap.Logger. The zero value is not usable; use New.
//
// Levels map Trace and Debug to zap's Debug, Info to Info, Warn to Warn, Error to Error; NoLevel
// is logged at Info. The zap core decides what is enabled: SetLevel is a no-op, since the
// Collector's service.telemetry.logs.level owns the level.
type Logger struct {
	root    *zap.Logger // the logger New was given, before any Named
	z       *zap.Logger // root, named and with the implied fields
	name    string
	implied []any
}

var _ hclog.Logger = (*Logger)(nil)

// New returns an hclog.Logger that writes every record to z.
func New(z *zap.Logger) *Logger {
	return &Logger{root: z, z: z}
}

// Level maps an hclog level to the zap level it is written at.
func Level(level hclog.Level) zapcore.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return zapcore.DebugLevel
	case hclog.Warn:
		return zapcore.WarnLevel
	case hclog.Error:
		return zapcore.ErrorLevel
	default: // NoLevel, Info, Off
		return zapcore.InfoLevel
	}
}

// Fields turns hclog's alternating key/value arguments into zap fields. A non-string key is
// formatted with fmt.Sprint; an odd trailing value is kept under EXTRA_VALUE_AT_END.
func Fields(args []any) []zap.Field {
	fields := make([]zap.Field, 0, (len(args)+1)/2)
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			fields = append(fields, zap.Any(extraValueKey, args[i]))
			break
		}
		key, ok := args[i].(string)
		if !ok {
			key = fmt.Sprint(args[i])
		}
		fields = append(fields, zap.Any(key, args[i+1]))
	}
	return fields
}

// Log writes msg at level with args as key/value pairs.
func (l *Logger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	if ce := l.z.Check(Level(level), msg); ce != nil {
		ce.Write(Fields(args)...)
	}
}

// Trace logs at zap's Debug level.
func (l *Logger) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }

// Debug logs at Debug.
func (l *Logger) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }

// Info logs at Info.
func (l *Logger) Info(msg string, args ...any) { l.Log(hclog.Info, msg, args...) }

// Warn logs at Warn.
func (l *Logger) Warn(msg string, args ...any) { l.Log(hclog.Warn, msg, args...) }

// Error logs at Error.
func (l *Logger) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

// IsTrace reports whether zap's Debug level is enabled (Trace is written at Debug).
func (l *Logger) IsTrace() bool { return l.z.Core().Enabled(zapcore.DebugLevel) }

// IsDebug reports whether zap's Debug level is enabled.
func (l *Logger) IsDebug() bool { return l.z.Core().Enabled(zapcore.DebugLevel) }

// IsInfo reports whether zap's Info level is enabled.
func (l *Logger) IsInfo() bool { return l.z.Core().Enabled(zapcore.InfoLevel) }

// IsWarn reports whether zap's Warn level is enabled.
func (l *Logger) IsWarn() bool { return l.z.Core().Enabled(zapcore.WarnLevel) }

// IsError reports whether zap's Error level is enabled.
func (l *Logger) IsError() bool { return l.z.Core().Enabled(zapcore.ErrorLevel) }

// ImpliedArgs returns the key/value pairs added with With.
func (l *Logger) ImpliedArgs() []any { return append([]any(nil), l.implied...) }

// With returns a logger that adds args to every record.
func (l *Logger) With(args ...any) hclog.Logger {
	implied := append(append([]any(nil), l.implied...), args...)
	return &Logger{root: l.root, z: l.z.With(Fields(args)...), name: l.name, implied: implied}
}

// Name returns the logger's dotted name ("" for the root).
func (l *Logger) Name() string { return l.name }

// Named returns a logger whose name is this one's with name appended.
func (l *Logger) Named(name string) hclog.Logger {
	full := name
	if l.name != "" {
		full = l.name + "." + name
	}
	return l.ResetNamed(full)
}

// ResetNamed returns a logger named exactly name, keeping the implied arguments.
func (l *Logger) ResetNamed(name string) hclog.Logger {
	z := l.root
	if name != "" {
		for part := range strings.SplitSeq(name, ".") {
			z = z.Named(part)
		}
	}
	return &Logger{root: l.root, z: z.With(Fields(l.implied)...), name: name, implied: l.implied}
}

// SetLevel does nothing: the zap core (the Collector's log level) decides what is written.
func (l *Logger) SetLevel(hclog.Level) {}

// GetLevel returns the lowest hclog level the zap core writes.
func (l *Logger) GetLevel() hclog.Level {
	switch {
	case l.IsDebug():
		return hclog.Debug
	case l.IsInfo():
		return hclog.Info
	case l.IsWarn():
		return hclog.Warn
	case l.IsError():
		return hclog.Error
	default:
		return hclog.Off
	}
}

// StandardLogger returns a standard library logger writing to zap at Info.
func (l *Logger) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return zap.NewStdLog(l.z)
}

// StandardWriter returns a writer whose lines are logged at Info.
func (l *Logger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return zap.NewStdLog(l.z).Writer()
}
