// Command fakekubelet serves the kubelet's pod-resources API v1 on a unix socket, built from the
// upstream generated Go server (k8s.io/kubelet/pkg/apis/podresources/v1), for the sidecar's
// pod-attribution tests (tests/kubernetes/). The sidecar's client is written from the API's
// documented field numbers; this server is the upstream's, so the two sides are not the same
// hands.
//
//	fakekubelet -socket /tmp/x/kubelet.sock -state /tmp/x/state.json [-apiserver-dir /tmp/x]
//
// The state file is read again on every call, so a test changes what the "kubelet" answers by
// replacing the file (atomically: write a temporary file and rename it). Its fields:
//
//	list                       a ListPodResourcesResponse in protobuf JSON (upstream field names)
//	allocatable                an AllocatableResourcesResponse in protobuf JSON
//	allocatable_unimplemented  answer GetAllocatableResources with UNIMPLEMENTED (old kubelets)
//	hang                       hold every call until the client's deadline passes
//	error_code                 answer every call with this gRPC status code (e.g. 14)
//	socket_mode                the socket file's mode once listening (default 0600, octal)
//
// The list answer may carry dynamic_resources (DRA claims: DynamicResource, ClaimResource,
// CDIDevice), encoded by the upstream types like everything else. With -apiserver-dir it also
// serves ResourceSlices as the Kubernetes API server would (apiserver.go).
//
// It prints "apiserver <url>" (with -apiserver-dir) and then "listening <socket>" on stdout
// once it serves, and exits on SIGTERM or SIGINT.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

type state struct {
	List                     json.RawMessage `json:"list"`
	Allocatable              json.RawMessage `json:"allocatable"`
	AllocatableUnimplemented bool            `json:"allocatable_unimplemented"`
	Hang                     bool            `json:"hang"`
	ErrorCode                uint32          `json:"error_code"`
	SocketMode               string          `json:"socket_mode"`
	ResourceSlicesFile       string          `json:"resource_slices_file"`
	Token                    string          `json:"token"`
	Forbidden                bool            `json:"forbidden"`
	ResourceSliceVersions    []string        `json:"resource_slice_versions"`
}

type server struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	statePath string
}

func (s *server) load(ctx context.Context) (*state, error) {
	raw, err := os.ReadFile(s.statePath)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "fakekubelet: state: %v", err)
	}
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, status.Errorf(codes.Internal, "fakekubelet: state: %v", err)
	}
	if st.Hang {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if st.ErrorCode != 0 {
		return nil, status.Errorf(codes.Code(st.ErrorCode), "fakekubelet: told to fail")
	}
	return &st, nil
}

func (s *server) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	st, err := s.load(ctx)
	if err != nil {
		return nil, err
	}
	resp := &podresourcesv1.ListPodResourcesResponse{}
	if len(st.List) > 0 {
		if err := protojson.Unmarshal(st.List, resp); err != nil {
			return nil, status.Errorf(codes.Internal, "fakekubelet: list: %v", err)
		}
	}
	return resp, nil
}

func (s *server) GetAllocatableResources(ctx context.Context, _ *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	st, err := s.load(ctx)
	if err != nil {
		return nil, err
	}
	if st.AllocatableUnimplemented {
		return nil, status.Error(codes.Unimplemented, "fakekubelet: GetAllocatableResources is not served")
	}
	resp := &podresourcesv1.AllocatableResourcesResponse{}
	if len(st.Allocatable) > 0 {
		if err := protojson.Unmarshal(st.Allocatable, resp); err != nil {
			return nil, status.Errorf(codes.Internal, "fakekubelet: allocatable: %v", err)
		}
	}
	return resp, nil
}

func main() {
	socket := flag.String("socket", "", "unix socket path to serve on")
	statePath := flag.String("state", "", "JSON state file, read on every call")
	apiDir := flag.String("apiserver-dir", "", "also serve ResourceSlices over HTTPS; its CA goes here")
	flag.Parse()
	if *socket == "" || *statePath == "" {
		log.Fatal("fakekubelet: -socket and -state are required")
	}
	raw, err := os.ReadFile(*statePath)
	if err != nil {
		log.Fatalf("fakekubelet: %v", err)
	}
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		log.Fatalf("fakekubelet: %s: %v", *statePath, err)
	}
	mode := os.FileMode(0o600)
	if st.SocketMode != "" {
		m, err := strconv.ParseUint(st.SocketMode, 8, 32)
		if err != nil {
			log.Fatalf("fakekubelet: socket_mode %q: %v", st.SocketMode, err)
		}
		mode = os.FileMode(m)
	}
	lis, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatalf("fakekubelet: %v", err)
	}
	if err := os.Chmod(*socket, mode); err != nil {
		log.Fatalf("fakekubelet: %v", err)
	}
	srv := grpc.NewServer()
	impl := &server{statePath: *statePath}
	podresourcesv1.RegisterPodResourcesListerServer(srv, impl)
	if *apiDir != "" {
		url, err := serveAPI(impl, *apiDir)
		if err != nil {
			log.Fatalf("fakekubelet: apiserver: %v", err)
		}
		fmt.Printf("apiserver %s\n", url)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		srv.Stop()
	}()
	fmt.Printf("listening %s\n", *socket)
	os.Stdout.Sync()
	if err := srv.Serve(lis); err != nil {
		log.Fatalf("fakekubelet: %v", err)
	}
}
