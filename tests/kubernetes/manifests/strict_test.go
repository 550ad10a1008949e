// Package manifests checks the chart's rendered objects without a cluster: every object decodes
// strictly into the upstream Kubernetes API types (k8s.io/api, and the Prometheus Operator's
// monitoring.coreos.com/v1 for ServiceMonitor and PodMonitor), so an unknown field, a
// misspelled key or a wrong type fails; then cross-references the API server would refuse or
// the kubelet would trip on (mounts of undeclared volumes, probes on undeclared ports, Service
// target ports no container has) are checked; and the gateway's k8sattributes configuration is
// validated by the processor itself.
//
// The files are deploy/manifests/*.yaml, plus every *.yaml in the directories listed (colon
// separated) in $GPUMETRICS_RENDERED_DIRS (scripts/check-kubernetes.sh renders each
// deploy/helm/gpumetrics/ci/*-values.yaml there).
package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

func strictDecoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(appsv1.AddToScheme(scheme))
	utilruntime.Must(rbacv1.AddToScheme(scheme))
	utilruntime.Must(monitoringv1.AddToScheme(scheme))
	return json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
}

// document is one YAML document of a rendered file.
type document struct {
	where string
	data  []byte
}

func documents(t *testing.T, path string) []document {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var out []document
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		out = append(out, document{fmt.Sprintf("%s#%d", filepath.Base(path), i), doc})
	}
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		b.WriteString(line + "\n")
	}
	return b.Bytes()
}

func renderedFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../../deploy/manifests/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("deploy/manifests holds %d YAML files, want the three rendered ones", len(files))
	}
	for _, dir := range filepath.SplitList(os.Getenv("GPUMETRICS_RENDERED_DIRS")) {
		if dir == "" {
			continue
		}
		more, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if len(more) == 0 {
			t.Fatalf("$GPUMETRICS_RENDERED_DIRS: %s holds no YAML file", dir)
		}
		files = append(files, more...)
	}
	return files
}

func decodeAll(t *testing.T) map[string][]runtime.Object {
	t.Helper()
	dec := strictDecoder(t)
	out := map[string][]runtime.Object{}
	for _, path := range renderedFiles(t) {
		for _, doc := range documents(t, path) {
			obj, _, err := dec.Decode(doc.data, nil, nil)
			if err != nil {
				t.Errorf("%s: %v", doc.where, err)
				continue
			}
			out[path] = append(out[path], obj)
		}
	}
	return out
}

func name(obj runtime.Object) string {
	if o, ok := obj.(interface{ GetName() string }); ok {
		return o.GetName()
	}
	return "?"
}

func TestRenderedObjectsDecodeStrictly(t *testing.T) {
	for path, objs := range decodeAll(t) {
		kinds := map[string]int{}
		for _, obj := range objs {
			kinds[fmt.Sprintf("%T", obj)]++
		}
		if kinds["*v1.DaemonSet"] != 1 {
			t.Errorf("%s: %d DaemonSets, want 1 (%v)", path, kinds["*v1.DaemonSet"], kinds)
		}
	}
}

// The decoder itself must refuse what it is here to refuse.
func TestStrictDecodingRefusesUnknownFieldsAndWrongTypes(t *testing.T) {
	dec := strictDecoder(t)
	for _, bad := range []string{
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec: {selector: {}, templat: {}}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: \"eighty\"}]}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: [{name: c, image: i, imagePullPolicy: Never, imagePullPolicy: Always}]\n",
		"apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec: {endpoint: []}\n",
		"apiVersion: example.com/v1\nkind: Unknown\nmetadata: {name: x}\n",
	} {
		if _, _, err := dec.Decode([]byte(bad), nil, nil); err == nil {
			t.Errorf("decoded without error:\n%s", bad)
		}
	}
}

func podSpecs(objs []runtime.Object) map[string]corev1.PodSpec {
	out := map[string]corev1.PodSpec{}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			out["DaemonSet/"+o.Name] = o.Spec.Template.Spec
		case *appsv1.Deployment:
			out["Deployment/"+o.Name] = o.Spec.Template.Spec
		}
	}
	return out
}

// What the API server or the kubelet would refuse, and strict decoding cannot see.
func TestPodSpecsReferenceOnlyWhatTheyDeclare(t *testing.T) {
	for path, objs := range decodeAll(t) {
		portNames := map[string]bool{}
		for where, spec := range podSpecs(objs) {
			volumes := map[string]bool{}
			for _, v := range spec.Volumes {
				if volumes[v.Name] {
					t.Errorf("%s %s: volume %q declared twice", path, where, v.Name)
				}
				volumes[v.Name] = true
			}
			used := map[string]bool{}
			for _, c := range spec.Containers {
				ports := map[string]int32{}
				for _, p := range c.Ports {
					if len(p.Name) > 15 {
						t.Errorf("%s %s/%s: port name %q longer than 15 characters", path, where, c.Name, p.Name)
					}
					ports[p.Name] = p.ContainerPort
					portNames[p.Name] = true
				}
				mounts := map[string]bool{}
				for _, m := range c.VolumeMounts {
					if !volumes[m.Name] {
						t.Errorf("%s %s/%s: mounts undeclared volume %q", path, where, c.Name, m.Name)
					}
					if mounts[m.MountPath] {
						t.Errorf("%s %s/%s: two mounts at %s", path, where, c.Name, m.MountPath)
					}
					mounts[m.MountPath] = true
					used[m.Name] = true
				}
				for kind, probe := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
					if probe == nil {
						t.Errorf("%s %s/%s: no %s probe", path, where, c.Name, kind)
						continue
					}
					checkProbePort(t, fmt.Sprintf("%s %s/%s %s probe", path, where, c.Name, kind), probe, ports)
				}
				sc := c.SecurityContext
				if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
					sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
					sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
					t.Errorf("%s %s/%s: want a read-only root, no privilege escalation and capabilities dropped", path, where, c.Name)
				}
				if sc != nil && sc.Privileged != nil && *sc.Privileged {
					t.Errorf("%s %s/%s: privileged", path, where, c.Name)
				}
			}
			for v := range volumes {
				if !used[v] {
					t.Errorf("%s %s: volume %q is mounted nowhere", path, where, v)
				}
			}
		}
		for _, obj := range objs {
			if svc, ok := obj.(*corev1.Service); ok {
				for _, p := range svc.Spec.Ports {
					if p.TargetPort.Type == intstr.String && !portNames[p.TargetPort.StrVal] {
						t.Errorf("%s Service/%s: targetPort %q is no container's port", path, svc.Name, p.TargetPort.StrVal)
					}
				}
			}
		}
	}
}

func checkProbePort(t *testing.T, where string, probe *corev1.Probe, ports map[string]int32) {
	t.Helper()
	switch {
	case probe.GRPC != nil:
		found := false
		for _, p := range ports {
			found = found || p == probe.GRPC.Port
		}
		if !found {
			t.Errorf("%s: gRPC port %d is not a container port", where, probe.GRPC.Port)
		}
	case probe.HTTPGet != nil:
		port := probe.HTTPGet.Port
		if port.Type == intstr.String {
			if _, ok := ports[port.StrVal]; !ok {
				t.Errorf("%s: port %q is not a container port", where, port.StrVal)
			}
		}
	default:
		t.Errorf("%s: neither a gRPC nor an HTTP probe", where)
	}
}
