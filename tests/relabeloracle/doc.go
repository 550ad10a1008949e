// Package relabeloracle holds only a test: it computes the expected result of every relabel
// test vector in tests/testdata/identity/ with Prometheus' own model/relabel package (the
// implementation parca-agent and Prometheus run), so the vectors the Python relabeler is tested
// against cannot agree with a bug of ours.
//
// It is a Go module of its own, not part of collector/, so that the Prometheus module never
// enters the requirements of the Collector components (which the Collector Builder merges into
// every distribution that includes them).
package relabeloracle
