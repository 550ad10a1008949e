package hclogzap

import (
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestLevels(t *testing.T) {
	tests := []struct {
		level hclog.Level
		want  zapcore.Level
	}{
		{hclog.Trace, zapcore.DebugLevel},
		{hclog.Debug, zapcore.DebugLevel},
		{hclog.Info, zapcore.InfoLevel},
		{hclog.NoLevel, zapcore.InfoLevel},
		{hclog.Warn, zapcore.WarnLevel},
		{hclog.Error, zapcore.ErrorLevel},
	}
	for _, tt := range tests {
		t.Run(tt.level.String(), func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			New(zap.New(core)).Log(tt.level, "msg", "k", "v")
			require.Equal(t, 1, logs.Len())
			assert.Equal(t, tt.want, logs.All()[0].Level)
			assert.Equal(t, map[string]any{"k": "v"}, logs.All()[0].ContextMap())
		})
	}
}

func TestOffIsNotLogged(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	New(zap.New(core)).Log(hclog.Off, "msg")
	assert.Zero(t, logs.Len())
}

func TestFields(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	New(zap.New(core)).Info("msg", "a", 1, 2, "two", "dangling")
	assert.Equal(t, map[string]any{"a": int64(1), "2": "two", extraValueKey: "dangling"}, logs.All()[0].ContextMap())
}

func TestNamedAndWith(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := New(zap.New(core)).Named("plugin").With("pid", 7).Named("gpumetrics")
	assert.Equal(t, "plugin.gpumetrics", l.Name())
	assert.Equal(t, []any{"pid", 7}, l.ImpliedArgs())
	l.Warn("hello")
	entry := logs.All()[0]
	assert.Equal(t, "plugin.gpumetrics", entry.LoggerName)
	assert.Equal(t, map[string]any{"pid": int64(7)}, entry.ContextMap())

	r := l.ResetNamed("other")
	r.Info("again")
	assert.Equal(t, "other", logs.All()[1].LoggerName)
	assert.Equal(t, map[string]any{"pid": int64(7)}, logs.All()[1].ContextMap(), "implied args survive ResetNamed")
}

func TestLevelQueriesFollowZap(t *testing.T) {
	core, _ := observer.New(zapcore.WarnLevel)
	l := New(zap.New(core))
	assert.False(t, l.IsTrace())
	assert.False(t, l.IsDebug())
	assert.False(t, l.IsInfo())
	assert.True(t, l.IsWarn())
	assert.True(t, l.IsError())
	assert.Equal(t, hclog.Warn, l.GetLevel())
	l.SetLevel(hclog.Trace)
	assert.Equal(t, hclog.Warn, l.GetLevel(), "zap owns the level")
}

func TestStandardLogger(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	New(zap.New(core)).StandardLogger(nil).Print("from log")
	require.Equal(t, 1, logs.Len())
	assert.Equal(t, "from log", logs.All()[0].Message)
}
