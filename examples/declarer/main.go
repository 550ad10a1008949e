// Command declarer is a minimal profiling agent built on the gpumetrics Go client
// (github.com/gpumetrics/gpumetrics/collector/pkg/declarer): it declares the given processes to
// a gpumetrics sidecar with the resource the OpenTelemetry eBPF profiler gives them
// (process.pid as an int, process.executable.path and .name from /proc/<pid>/exe, and
// process.environment_variable.<NAME> for each name in -env-vars the process has), re-reads
// them every -interval (only a changed declaration is sent) and reports each exit. An agent
// that is not a Collector (parca-agent style) would do the same from its own process table.
//
//	go run . -endpoint unix:///run/gpumetrics/profiler.sock -name my-agent 4242 4243
//	go run . -endpoint 127.0.0.1:4319 -once $$      # declare this shell, wait for the answer, exit
//
// With -once it declares, waits until the sidecar answered every declaration (at most
// -timeout) and exits 0, or 1 when a given pid could not be read, or something was rejected or
// not answered. The declarer name is the agent's identity: a run with the same -name replaces
// what an earlier run declared (its resync releases what this run does not declare). Otherwise it runs
// until every given process exited, or until SIGINT/SIGTERM. docs/protocol.md describes the
// protocol and the client.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpumetrics/gpumetrics/collector/pkg/declarer"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "declarer:", err)
		os.Exit(1)
	}
}

type options struct {
	endpoint, name, tokenFile, procRoot string
	envVars                             []string
	interval, timeout                   time.Duration
	once                                bool
	pids                                []uint32
}

func parseFlags() (options, error) {
	var o options
	var envVars string
	flag.StringVar(&o.endpoint, "endpoint", "127.0.0.1:4319", "the sidecar's profiler listener: host:port or unix:///path (plaintext)")
	flag.StringVar(&o.name, "name", "example-declarer", "the declarer name (gpumetrics-declarer metadata); keep it stable across restarts")
	flag.StringVar(&o.tokenFile, "token-file", "", "a file holding a declare token (sent as a bearer token)")
	flag.StringVar(&o.procRoot, "proc-root", "/proc", "where the pids are looked up")
	flag.StringVar(&envVars, "env-vars", "OTEL_SERVICE_NAME,OTEL_RESOURCE_ATTRIBUTES", "environment variables put on the resource, as the eBPF profiler's -env-vars")
	flag.DurationVar(&o.interval, "interval", 5*time.Second, "how often the processes are re-read")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Second, "with -once: the longest wait for the sidecar's answers")
	flag.BoolVar(&o.once, "once", false, "declare, wait for the answers, exit")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] PID...\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	for _, arg := range flag.Args() {
		pid, err := strconv.ParseUint(arg, 10, 32)
		if err != nil || pid == 0 {
			return o, fmt.Errorf("pid %q: want a positive integer", arg)
		}
		o.pids = append(o.pids, uint32(pid))
	}
	if len(o.pids) == 0 {
		flag.Usage()
		return o, errors.New("no pid given")
	}
	if err := checkEndpoint(o.endpoint); err != nil {
		return o, err
	}
	for _, v := range strings.Split(envVars, ",") {
		if v = strings.TrimSpace(v); v != "" {
			o.envVars = append(o.envVars, v)
		}
	}
	return o, nil
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(o.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client, err := declarer.New(conn, declarer.Options{Name: o.name, Token: tokenReader(o.tokenFile), Observer: printer{}})
	if err != nil {
		return err
	}
	if err := client.Start(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	live := map[uint32]uint64{} // pid -> start time declared
	unread := 0                 // given pids the first scan could not declare
	scan := func() {
		for _, pid := range o.pids {
			start, err := declarer.StartTimeTicks(o.procRoot, pid)
			if errors.Is(err, fs.ErrNotExist) {
				if held, ok := live[pid]; ok {
					client.Exit(pid, held)
					delete(live, pid)
					fmt.Printf("pid %d exited\n", pid)
				} else {
					fmt.Fprintf(os.Stderr, "declarer: pid %d: no such process in %s\n", pid, o.procRoot)
					unread++
				}
				continue
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "declarer: pid %d: %v\n", pid, err)
				unread++
				continue
			}
			p := describe(o.procRoot, pid, start, o.envVars)
			if _, err := client.Declare(p); err != nil {
				fmt.Fprintf(os.Stderr, "declarer: pid %d: %v\n", pid, err)
				unread++
				continue
			}
			live[pid] = start
		}
	}
	scan()
	if o.once {
		if err := waitAnswered(ctx, client, o.timeout, len(live)); err != nil {
			return err
		}
		if unread > 0 {
			return fmt.Errorf("%d of %d pids could not be declared", unread, len(o.pids))
		}
		return nil
	}
	unread = 0 // later scans: a pid that is gone has exited
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for len(live) > 0 {
		select {
		case <-ctx.Done():
			return closeClient(client)
		case <-t.C:
			scan()
		}
	}
	fmt.Println("every process exited")
	return closeClient(client)
}

// describe builds p's declaration the way the eBPF profiler builds its resource
// (reporter/internal/pdata/generate.go, setResourceAttributes).
func describe(procRoot string, pid uint32, start uint64, envVars []string) declarer.Process {
	dir := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10))
	res := pcommon.NewMap()
	res.PutInt("process.pid", int64(pid))
	if exe, err := os.Readlink(filepath.Join(dir, "exe")); err == nil {
		res.PutStr("process.executable.path", exe)
		res.PutStr("process.executable.name", filepath.Base(exe))
	}
	var env []declarer.EnvVar
	if raw, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil {
		for _, kv := range bytes.Split(raw, []byte{0}) {
			name, value, ok := bytes.Cut(kv, []byte("="))
			if !ok {
				continue
			}
			for _, want := range envVars {
				if string(name) == want {
					res.PutStr("process.environment_variable."+want, string(value))
					env = append(env, declarer.EnvVar{Name: want, Value: value})
				}
			}
		}
	}
	return declarer.Process{PID: pid, StartTimeTicks: start, Resource: res, Environment: env}
}

// checkEndpoint refuses what grpc would dial somewhere unexpected: a host without a port (grpc
// would use 443) or a relative unix socket path.
func checkEndpoint(endpoint string) error {
	if path, ok := strings.CutPrefix(endpoint, "unix:"); ok {
		if !strings.HasPrefix(strings.TrimPrefix(path, "//"), "/") {
			return fmt.Errorf("-endpoint %q: a unix socket needs an absolute path (unix:///run/gpumetrics/profiler.sock)", endpoint)
		}
		return nil
	}
	if _, port, err := net.SplitHostPort(endpoint); err != nil || port == "" {
		return fmt.Errorf("-endpoint %q: want host:port or unix:///absolute/path", endpoint)
	}
	return nil
}

// waitAnswered waits until the sidecar answered n declarations (or a rejection), then closes.
func waitAnswered(ctx context.Context, client *declarer.Client, timeout time.Duration, n int) error {
	deadline := time.Now().Add(timeout)
	for {
		s := client.Stats()
		if s.Connected && s.Pending == 0 && int(s.Declared+s.Rejected) >= n {
			if err := closeClient(client); err != nil {
				return err
			}
			fmt.Printf("declared %d, rejected %d\n", s.Declared, s.Rejected)
			if s.Rejected > 0 {
				return errors.New("the sidecar rejected a declaration")
			}
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = closeClient(client)
			return fmt.Errorf("the sidecar did not answer within %s (stats: %+v)", timeout, s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func closeClient(client *declarer.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return client.Close(ctx)
}

// tokenReader returns a declarer.Options.Token that reads file for every stream (nil: no token).
func tokenReader(file string) func() (string, error) {
	if file == "" {
		return nil
	}
	return func() (string, error) {
		b, err := os.ReadFile(file)
		return strings.TrimSpace(string(b)), err
	}
}

// printer prints the client's events.
type printer struct{}

func (printer) Resynced(declared int, released uint32) {
	fmt.Printf("resynchronised: %d declared, %d stale released\n", declared, released)
}

func (printer) StreamFailed(err error) {
	fmt.Fprintf(os.Stderr, "declarer: stream failed (retrying): %v\n", err)
}

func (printer) Rejected(pid uint32, field, reason string) {
	fmt.Fprintf(os.Stderr, "declarer: pid %d rejected: %s: %s\n", pid, field, reason)
}
