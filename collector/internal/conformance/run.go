package conformance

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	gpumetricsv1 "github.com/gpumetrics/gpumetrics/collector/internal/gpumetricsv1"
)

// CallTimeout bounds every call of a case: never reached by a healthy sidecar, however loaded
// the machine.
const CallTimeout = 30 * time.Second

const declarerKey = "gpumetrics-declarer"

// Target is a sidecar that cases run against.
type Target interface {
	// Conn is the connection to the sidecar (a new one after Restart).
	Conn() grpc.ClientConnInterface
	// Restart restarts the sidecar: new epochs, nothing held, no consumer, no declaration.
	Restart(t testing.TB)
}

// Control is what a target whose stores the cases control adds (the controlled steps).
type Control interface {
	// Append stores data, a serialized batch of items, in the store of service ("pull" or
	// "logs") and returns its sequence.
	Append(t testing.TB, service string, data []byte, items uint64) uint64
	// Advance moves the stores' clock.
	Advance(d time.Duration)
	// Held returns the sequences the store of service holds.
	Held(service string) []uint64
}

// RunAll runs, as subtests named by case, every case of services that run accepts, each against
// the target newTarget makes for it.
func RunAll(t *testing.T, services []string, run func(Case) bool, newTarget func(t *testing.T, c Case) Target) {
	t.Helper()
	ran := 0
	for _, service := range services {
		cases, err := Load(service)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			if !run(c) {
				continue
			}
			ran++
			t.Run(c.ID(), func(t *testing.T) { Run(t, c, newTarget(t, c)) })
		}
	}
	if ran == 0 {
		t.Fatal("no conformance case to run")
	}
}

// known is what the runner knows of one batch: its bytes and items (nil data: the real
// sidecar's first collection, learned when first received).
type known struct {
	data  []byte
	items uint64
}

// storeState is what the runner knows of one store.
type storeState struct {
	batches           map[uint64]*known
	next              uint64
	current, previous string
	seen              map[string]bool
	restarted         bool
}

func newStoreState() *storeState {
	return &storeState{batches: map[uint64]*known{}, next: 1, seen: map[string]bool{}}
}

type runner struct {
	t       *testing.T
	c       Case
	target  Target
	control Control // nil: the real sidecar
	stores  map[string]*storeState
	streams map[string]*stream
	where   string
}

// Run runs case c against target; a controlled case needs a target that is a Control.
func Run(t *testing.T, c Case, target Target) {
	t.Helper()
	r := &runner{t: t, c: c, target: target, stores: map[string]*storeState{"pull": newStoreState(), "logs": newStoreState()}, streams: map[string]*stream{}}
	r.control, _ = target.(Control)
	if c.Controlled() && r.control == nil {
		t.Fatalf("%s: a controlled case, and this target cannot control its stores", c.ID())
	}
	t.Cleanup(func() {
		for _, s := range r.streams {
			s.cancel()
		}
	})
	r.given()
	for i, s := range c.Steps {
		r.where = fmt.Sprintf("%s: steps[%d] (%s)", c.ID(), i, s.Kind)
		r.step(s)
	}
	for name := range r.streams {
		t.Fatalf("%s: stream %q was never closed", c.ID(), name)
	}
}

func (r *runner) fail(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("%s: %s", r.where, fmt.Sprintf(format, args...))
}

func (r *runner) decode(node *yaml.Node, v any, what string) {
	r.t.Helper()
	if err := decodeNode(node, v); err != nil {
		r.fail("%s: %v", what, err)
	}
}

func (r *runner) given() {
	if r.c.Given != "first_collection" {
		return
	}
	if r.control != nil {
		r.where = r.c.ID() + ": given"
		r.storeBatch("pull", FirstCollectionPoints, nil)
		return
	}
	st := r.stores["pull"]
	st.batches[1] = &known{} // the real sidecar's first collection, learned when received
	st.next = 2
}

func (r *runner) step(s Step) {
	switch s.Kind {
	case "append":
		var a appendStep
		r.decode(&s.Body, &a, "append")
		for range max(a.Count, 1) {
			r.storeBatch(r.c.Service, a.Points, a.Bytes)
		}
	case "advance":
		var a advanceStep
		r.decode(&s.Body, &a, "advance")
		r.control.Advance(time.Duration(a.Seconds * float64(time.Second)))
	case "held":
		var want []uint64
		r.decode(&s.Body, &want, "held")
		if got := r.control.Held(r.c.Service); !slices.Equal(got, want) {
			r.fail("want batches %v held, the store holds %v", want, got)
		}
	case "restart":
		r.restart()
	case "pull":
		r.pull(s)
	case "declare":
		r.declare(s)
	case "exits":
		r.exits(s)
	case "open":
		r.open(s)
	case "send":
		r.send(s)
	case "close":
		r.close(s)
	default:
		r.fail("unknown step")
	}
}

func (r *runner) storeBatch(service string, items uint64, size *int) {
	st := r.stores[service]
	seq := st.next
	data := Batch(service, seq, items)
	if size != nil && len(data) != *size {
		r.fail("the batch is %d bytes, the case says %d", len(data), *size)
	}
	if got := r.control.Append(r.t, service, data, items); got != seq {
		r.fail("the store gave the batch sequence %d, want %d", got, seq)
	}
	st.batches[seq] = &known{data: data, items: items}
	st.next = seq + 1
}

func (r *runner) restart() {
	if len(r.streams) > 0 {
		r.fail("close the streams before a restart")
	}
	r.target.Restart(r.t)
	for _, st := range r.stores {
		st.batches, st.next = map[uint64]*known{}, 1
		st.previous, st.restarted = st.current, true
	}
	r.given()
}

func (r *runner) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	r.t.Cleanup(cancel)
	return ctx
}

// checkError compares a call's error with want (nil: the call must succeed); it reports whether
// the call failed (as wanted).
func (r *runner) checkError(want *errorWant, err error) bool {
	r.t.Helper()
	if err == nil {
		if want != nil {
			r.fail("want %s %q..., the call succeeded", want.Code, want.Message)
		}
		return false
	}
	st, _ := status.FromError(err)
	if want == nil {
		r.fail("failed: %v", err)
	}
	code, cerr := want.code()
	if cerr != nil {
		r.fail("%v", cerr)
	}
	if st.Code() != code || !strings.HasPrefix(st.Message(), want.Message) {
		r.fail("want %s %q..., got %s %q", want.Code, want.Message, st.Code(), st.Message())
	}
	return true
}

// request resolves the runner's values of a pull request and builds the message.
func (r *runner) request(body *yaml.Node, msg proto.Message) {
	st := r.stores[r.c.Service]
	var values map[string]any
	r.decode(body, &values, "pull")
	switch values["ack_epoch"] {
	case "current", "previous":
		epoch := st.current
		if values["ack_epoch"] == "previous" {
			epoch = st.previous
		}
		if epoch == "" {
			r.fail("ack_epoch %v: no such epoch seen yet", values["ack_epoch"])
		}
		values["ack_epoch"] = epoch
	}
	if size, ok := values["max_bytes"].(map[string]any); ok {
		total := 0
		seqs, _ := size["size_of"].([]any)
		for _, s := range seqs {
			n, _ := s.(int)
			b := st.batches[uint64(n)] //nolint:gosec // small sequences
			if b == nil || b.data == nil {
				r.fail("max_bytes: no batch %v known", s)
			}
			total += len(b.data)
		}
		plus, _ := size["plus"].(int)
		values["max_bytes"] = total + plus
	}
	raw, err := json.Marshal(values)
	if err != nil {
		r.fail("pull: %v", err)
	}
	if err := protojson.Unmarshal(raw, msg); err != nil {
		r.fail("pull: not a %T: %v", msg, err)
	}
}

// answer is a pull answer of either signal.
type answer struct {
	epoch                 string
	first, last, items    uint64
	payload               []byte
	more                  bool
	dropped, droppedTotal uint64
	reasons               []string
}

func (r *runner) pull(s Step) {
	var want pullWant
	r.decode(s.Want, &want, "want")
	var (
		got answer
		err error
	)
	if r.c.Service == "logs" {
		req := &gpumetricsv1.PullLogsRequest{}
		r.request(&s.Body, req)
		var resp *gpumetricsv1.PullLogsResponse
		resp, err = gpumetricsv1.NewLogsPullServiceClient(r.target.Conn()).PullLogs(r.ctx(), req)
		got = answer{resp.GetEpoch(), resp.GetFirstSequence(), resp.GetLastSequence(), resp.GetLogRecords(),
			resp.GetExportLogsServiceRequest(), resp.GetMore(), resp.GetDroppedLogRecords(), resp.GetDroppedLogRecordsTotal(), resp.GetDropReasons()}
		if want.DroppedDataPoints+want.DroppedDataPointsTotal > 0 {
			r.fail("a logs answer has dropped_log_records, not dropped_data_points")
		}
		want.DroppedDataPoints, want.DroppedDataPointsTotal = want.DroppedLogRecords, want.DroppedLogRecordsTotal
	} else {
		req := &gpumetricsv1.PullRequest{}
		r.request(&s.Body, req)
		var resp *gpumetricsv1.PullResponse
		resp, err = gpumetricsv1.NewMetricsPullServiceClient(r.target.Conn()).Pull(r.ctx(), req)
		got = answer{resp.GetEpoch(), resp.GetFirstSequence(), resp.GetLastSequence(), resp.GetDataPoints(),
			resp.GetExportMetricsServiceRequest(), resp.GetMore(), resp.GetDroppedDataPoints(), resp.GetDroppedDataPointsTotal(), resp.GetDropReasons()}
		if want.DroppedLogRecords+want.DroppedLogRecordsTotal > 0 {
			r.fail("a metrics answer has dropped_data_points, not dropped_log_records")
		}
	}
	if r.checkError(want.Error, err) {
		return
	}
	r.epoch(got.epoch)
	r.learn(want.Batches, got)
	st := r.stores[r.c.Service]
	var payload []byte
	var items uint64
	for _, seq := range want.Batches {
		b := st.batches[seq]
		if b == nil {
			r.fail("want batch %d, which no step stored", seq)
		}
		payload = append(payload, b.data...)
		items += b.items
	}
	wantFirst, wantLast := uint64(0), uint64(0)
	if n := len(want.Batches); n > 0 {
		wantFirst, wantLast = want.Batches[0], want.Batches[n-1]
	}
	reasons := slices.Sorted(slices.Values(got.reasons))
	wantReasons := slices.Sorted(slices.Values(want.DropReasons))
	switch {
	case got.first != wantFirst || got.last != wantLast:
		r.fail("want batches %d..%d, got %d..%d (more %v)", wantFirst, wantLast, got.first, got.last, got.more)
	case !bytes.Equal(got.payload, payload):
		r.fail("the payload (%d bytes) is not the batches %v (%d bytes)", len(got.payload), want.Batches, len(payload))
	case got.items != items:
		r.fail("want %d items, got %d", items, got.items)
	case got.more != want.More:
		r.fail("want more %v, got %v (batches %d..%d)", want.More, got.more, got.first, got.last)
	case got.dropped != want.DroppedDataPoints || got.droppedTotal != want.DroppedDataPointsTotal:
		r.fail("want dropped %d (total %d), got %d (total %d)", want.DroppedDataPoints, want.DroppedDataPointsTotal, got.dropped, got.droppedTotal)
	case !slices.Equal(reasons, wantReasons):
		r.fail("want drop reasons %v, got %v", wantReasons, reasons)
	}
}

// learn records the bytes of a batch the runner did not store itself (the real sidecar's first
// collection) from the answer that holds it alone, after checking that they decode as the
// signal's export request with as many items as the answer says.
func (r *runner) learn(batches []uint64, got answer) {
	st := r.stores[r.c.Service]
	for _, seq := range batches {
		b := st.batches[seq]
		if b == nil || b.data != nil {
			continue
		}
		if len(batches) != 1 || got.first != seq || got.last != seq {
			r.fail("batch %d is not known yet: it must first come alone (got %d..%d)", seq, got.first, got.last)
		}
		var n int
		if r.c.Service == "logs" {
			req := plogotlp.NewExportRequest()
			if err := req.UnmarshalProto(got.payload); err != nil {
				r.fail("batch %d: %v", seq, err)
			}
			n = req.Logs().LogRecordCount()
		} else {
			req := pmetricotlp.NewExportRequest()
			if err := req.UnmarshalProto(got.payload); err != nil {
				r.fail("batch %d: %v", seq, err)
			}
			n = req.Metrics().DataPointCount()
		}
		if n == 0 || uint64(n) != got.items { //nolint:gosec // counts are positive
			r.fail("batch %d holds %d items, the answer says %d", seq, n, got.items)
		}
		b.data, b.items = slices.Clone(got.payload), got.items
	}
}

func (r *runner) epoch(epoch string) {
	st := r.stores[r.c.Service]
	switch {
	case st.restarted:
		if st.seen[epoch] {
			r.fail("after a restart the epoch %q is not new", epoch)
		}
		st.restarted = false
	case st.current != "" && epoch != st.current:
		r.fail("epoch %q changed from %q", epoch, st.current)
	}
	st.current, st.seen[epoch] = epoch, true
}

func (r *runner) withDeclarer(ctx context.Context, declarer *string) context.Context {
	if declarer == nil {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, declarerKey, *declarer)
}

func (r *runner) profiler() gpumetricsv1.ProfilerIntegrationServiceClient {
	return gpumetricsv1.NewProfilerIntegrationServiceClient(r.target.Conn())
}

func (r *runner) declaration(p process) *gpumetricsv1.ProcessDeclaration {
	d := &gpumetricsv1.ProcessDeclaration{Pid: p.PID, StartTimeTicks: p.StartTimeTicks}
	for _, e := range p.Environment {
		d.Environment = append(d.Environment, &gpumetricsv1.EnvironmentVariable{Name: e.Name, Value: e.Value})
	}
	ctx, err := hex.DecodeString(p.ProcessContextHex)
	if err != nil {
		r.fail("process_context_hex: %v", err)
	}
	d.ProcessContext = ctx
	if n := len(p.Resource.Content); n > 0 {
		res := &resourcepb.Resource{}
		for i := 0; i+1 < n; i += 2 {
			res.Attributes = append(res.Attributes, &commonpb.KeyValue{Key: p.Resource.Content[i].Value, Value: r.anyValue(p.Resource.Content[i+1])})
		}
		d.ProfilerResource = marshal(res)
	}
	return d
}

// anyValue is a resource attribute's value: a YAML string, int, bool or float.
func (r *runner) anyValue(node *yaml.Node) *commonpb.AnyValue {
	var v any
	r.decode(node, &v, "resource value")
	switch x := v.(type) {
	case string:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: x}}
	case bool:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: x}}
	case int:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(x)}}
	case float64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: x}}
	}
	r.fail("resource value %v: a string, int, bool or float", v)
	return nil
}

func (r *runner) rejections(want []rejectionWant, got []*gpumetricsv1.Rejection) {
	r.t.Helper()
	if len(want) != len(got) {
		r.fail("want %d rejections, got %v", len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if w.Index != g.GetIndex() || w.PID != g.GetPid() || w.Field != g.GetField() {
			r.fail("want rejection (%d, %d, %q), got (%d, %d, %q) (%s)", w.Index, w.PID, w.Field, g.GetIndex(), g.GetPid(), g.GetField(), g.GetReason())
		}
		if g.GetReason() == "" || !strings.Contains(g.GetReason(), w.Reason) {
			r.fail("rejection of %s: want %q in %q", g.GetField(), w.Reason, g.GetReason())
		}
	}
}

func (r *runner) declare(s Step) {
	var body declareStep
	var want declareWant
	r.decode(&s.Body, &body, "declare")
	r.decode(s.Want, &want, "want")
	req := &gpumetricsv1.DeclareProcessesRequest{ReplaceAll: body.ReplaceAll}
	for _, p := range body.Processes {
		req.Processes = append(req.Processes, r.declaration(p))
	}
	resp, err := r.profiler().DeclareProcesses(r.withDeclarer(r.ctx(), body.Declarer), req)
	if r.checkError(want.Error, err) {
		return
	}
	if resp.GetAccepted() != want.Accepted || resp.GetReleased() != want.Released {
		r.fail("want accepted %d, released %d; got %d, %d (rejected %v)", want.Accepted, want.Released, resp.GetAccepted(), resp.GetReleased(), resp.GetRejected())
	}
	r.rejections(want.Rejected, resp.GetRejected())
}

func (r *runner) exits(s Step) {
	var body exitsStep
	var want exitsWant
	r.decode(&s.Body, &body, "exits")
	r.decode(s.Want, &want, "want")
	req := &gpumetricsv1.ReportExitsRequest{}
	for _, e := range body.Exits {
		req.Exits = append(req.Exits, &gpumetricsv1.ProcessExit{Pid: e.PID, StartTimeTicks: e.StartTimeTicks})
	}
	resp, err := r.profiler().ReportExits(r.ctx(), req)
	if r.checkError(want.Error, err) {
		return
	}
	if resp.GetReleased() != want.Released {
		r.fail("want released %d, got %d", want.Released, resp.GetReleased())
	}
	r.rejections(want.Rejected, resp.GetRejected())
}

type stream struct {
	s      grpc.BidiStreamingClient[gpumetricsv1.StreamDeclarationsRequest, gpumetricsv1.StreamDeclarationsResponse]
	cancel context.CancelFunc
}

func (r *runner) open(s Step) {
	var body openStep
	r.decode(&s.Body, &body, "open")
	if _, ok := r.streams[body.Stream]; ok {
		r.fail("stream %q is already open", body.Stream)
	}
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	st, err := r.profiler().StreamDeclarations(r.withDeclarer(ctx, body.Declarer))
	if s.Want == nil {
		if err != nil {
			cancel()
			r.fail("opening the stream: %v", err)
		}
		r.streams[body.Stream] = &stream{s: st, cancel: cancel}
		return
	}
	defer cancel()
	var want openWant
	r.decode(s.Want, &want, "want")
	if err == nil {
		var resp *gpumetricsv1.StreamDeclarationsResponse
		if resp, err = st.Recv(); err == nil {
			r.fail("want the stream to fail, it answered %v", resp)
		}
	}
	r.checkError(want.Error, err)
}

func (r *runner) send(s Step) {
	var body sendStep
	var want sendWant
	r.decode(&s.Body, &body, "send")
	r.decode(s.Want, &want, "want")
	st := r.streams[body.Stream]
	if st == nil {
		r.fail("no open stream %q", body.Stream)
	}
	ev := &gpumetricsv1.StreamDeclarationsRequest{}
	switch {
	case body.Declare != nil:
		ev.Event = &gpumetricsv1.StreamDeclarationsRequest_Declare{Declare: r.declaration(*body.Declare)}
	case body.DeclareBatch != nil:
		batch := &gpumetricsv1.DeclareBatch{}
		for _, p := range body.DeclareBatch.Processes {
			batch.Processes = append(batch.Processes, r.declaration(p))
		}
		ev.Event = &gpumetricsv1.StreamDeclarationsRequest_DeclareBatch{DeclareBatch: batch}
	case body.Exit != nil:
		ev.Event = &gpumetricsv1.StreamDeclarationsRequest_Exit{Exit: &gpumetricsv1.ProcessExit{Pid: body.Exit.PID, StartTimeTicks: body.Exit.StartTimeTicks}}
	case body.ResyncBegin != nil:
		ev.Event = &gpumetricsv1.StreamDeclarationsRequest_ResyncBegin{ResyncBegin: &gpumetricsv1.ResyncBegin{}}
	case body.ResyncEnd != nil:
		ev.Event = &gpumetricsv1.StreamDeclarationsRequest_ResyncEnd{ResyncEnd: &gpumetricsv1.ResyncEnd{}}
	}
	if err := st.s.Send(ev); err != nil {
		r.fail("sending on the stream: %v", err)
	}
	resp, err := st.s.Recv()
	if err != nil {
		r.fail("the stream failed: %v", err)
	}
	if resp.GetAccepted() != want.Accepted || resp.GetReleased() != want.Released || resp.GetDeclared() != want.Declared {
		r.fail("want accepted %v, released %d, declared %d; got %v, %d, %d (%v)", want.Accepted, want.Released, want.Declared,
			resp.GetAccepted(), resp.GetReleased(), resp.GetDeclared(), resp.GetRejection())
	}
	r.rejections(want.Rejections, resp.GetRejections())
	switch {
	case want.Rejection == nil && resp.GetRejection() != nil:
		r.fail("unexpected rejection %v", resp.GetRejection())
	case want.Rejection != nil:
		var got []*gpumetricsv1.Rejection
		if resp.GetRejection() != nil {
			got = append(got, resp.GetRejection())
		}
		r.rejections([]rejectionWant{*want.Rejection}, got)
	}
}

// close ends the client's side of a stream and waits until the server ended it (after its last
// answer, the server has released what the stream held: an abandoned resync, its slot).
func (r *runner) close(s Step) {
	var body closeStep
	r.decode(&s.Body, &body, "close")
	st := r.streams[body.Stream]
	if st == nil {
		r.fail("no open stream %q", body.Stream)
	}
	delete(r.streams, body.Stream)
	defer st.cancel()
	if err := st.s.CloseSend(); err != nil {
		r.fail("closing the stream: %v", err)
	}
	resp, err := st.s.Recv()
	switch {
	case err == nil:
		r.fail("an answer after the last event: %v", resp)
	case !errors.Is(err, io.EOF):
		r.fail("the stream ended with %v", err)
	}
}
