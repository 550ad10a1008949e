package main

// The fake API server: with -apiserver-dir, the fake kubelet also serves the one API-server
// call the sidecar makes (kubernetes.dra.resource_slices), a list of ResourceSlices, over HTTPS
// on 127.0.0.1 with a certificate made at start (its CA is written to <dir>/ca.crt). The slices
// come from the file the state's resource_slices_file names (YAML or JSON: a List or
// ResourceSliceList, or a single ResourceSlice), decoded strictly into the upstream
// k8s.io/api/resource/v1 types: a field the API does not define fails the call, so the payload
// the sidecar reads is one the real API server could send. State keys used here:
//
//	resource_slices_file      the slices to serve
//	token                     the bearer token required (401 without it, like the API server)
//	forbidden                 answer 403 with a Status, as for a service account without RBAC
//	resource_slice_versions   the resource.k8s.io versions served (default ["v1"]; others 404)
//
// It honours what the real server does for this call: the field selector on the two selectable
// fields of ResourceSlices (spec.nodeName, spec.driver; any other field is a 400 "field label
// not supported"), and paging with limit and continue.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

type sliceFile struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        map[string]any             `json:"metadata,omitempty"`
	Items           []resourcev1.ResourceSlice `json:"items"`
}

// loadSlices decodes path strictly: a list of ResourceSlices, or one ResourceSlice.
func loadSlices(path string) ([]resourcev1.ResourceSlice, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list sliceFile
	if err := yaml.UnmarshalStrict(raw, &list); err == nil && list.Items != nil {
		return list.Items, nil
	} else if !strings.Contains(string(raw), "kind: ResourceSlice\n") {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var one resourcev1.ResourceSlice
	if err := yaml.UnmarshalStrict(raw, &one); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return []resourcev1.ResourceSlice{one}, nil
}

func apiStatus(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  message,
		Reason:   metav1.StatusReason(reason),
		Code:     int32(code),
	})
}

func (s *server) resourceSlices(w http.ResponseWriter, r *http.Request) {
	st, err := s.load(r.Context())
	if err != nil {
		apiStatus(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	if st.Token == "" || r.Header.Get("Authorization") != "Bearer "+st.Token {
		apiStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	// apis/resource.k8s.io/<version>/resourceslices
	versions := st.ResourceSliceVersions
	if len(versions) == 0 {
		versions = []string{"v1"}
	}
	if len(parts) != 4 || parts[0] != "apis" || parts[1] != "resource.k8s.io" ||
		parts[3] != "resourceslices" || !slices.Contains(versions, parts[2]) {
		apiStatus(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
		return
	}
	if st.Forbidden {
		apiStatus(w, http.StatusForbidden, "Forbidden", `resourceslices.resource.k8s.io is forbidden: `+
			`User "system:serviceaccount:gpumetrics:gpumetrics" cannot list resource "resourceslices" `+
			`in API group "resource.k8s.io" at the cluster scope`)
		return
	}
	want := map[string]string{}
	if sel := r.URL.Query().Get("fieldSelector"); sel != "" {
		for _, term := range strings.Split(sel, ",") {
			key, value, ok := strings.Cut(term, "=")
			if !ok || (key != "spec.nodeName" && key != "spec.driver") {
				apiStatus(w, http.StatusBadRequest, "BadRequest", "field label not supported: "+key)
				return
			}
			want[key] = value
		}
	}
	all, err := loadSlices(st.ResourceSlicesFile)
	if err != nil {
		apiStatus(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	var matched []resourcev1.ResourceSlice
	for _, slice := range all {
		node := ""
		if slice.Spec.NodeName != nil {
			node = *slice.Spec.NodeName
		}
		if v, ok := want["spec.nodeName"]; ok && v != node {
			continue
		}
		if v, ok := want["spec.driver"]; ok && v != slice.Spec.Driver {
			continue
		}
		matched = append(matched, slice)
	}
	start, _ := strconv.Atoi(r.URL.Query().Get("continue"))
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	start = min(start, len(matched))
	end := len(matched)
	if limit > 0 && start+limit < end {
		end = start + limit
	}
	out := resourcev1.ResourceSliceList{
		TypeMeta: metav1.TypeMeta{Kind: "ResourceSliceList", APIVersion: "resource.k8s.io/" + parts[2]},
		ListMeta: metav1.ListMeta{ResourceVersion: "1"},
		Items:    matched[start:end],
	}
	if end < len(matched) {
		out.Continue = strconv.Itoa(end)
	}
	if out.Items == nil {
		out.Items = []resourcev1.ResourceSlice{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// serveAPI listens on 127.0.0.1:0 with a fresh self-signed certificate for 127.0.0.1 and
// returns its URL; the certificate (its own CA) is written to <dir>/ca.crt.
func serveAPI(s *server, dir string) (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fake-apiserver"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return "", err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), certPEM, 0o644); err != nil {
		return "", err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/apis/", s.resourceSlices)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
			MinVersion:   tls.VersionTLS12,
		},
	}
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	return "https://" + lis.Addr().String(), nil
}
