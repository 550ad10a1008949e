package conformance

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// SidecarCommand is the `gpumetrics` console script for tests that start the real sidecar:
// $SIDECAR_COMMAND (collector/scripts/test.sh always sets it; the test fails when it is set but
// missing), else the repository's .venv; the test is skipped only when neither exists (`go test`
// run by hand before the Python package is installed).
func SidecarCommand(t testing.TB) string {
	t.Helper()
	if path := os.Getenv("SIDECAR_COMMAND"); path != "" {
		_, err := os.Stat(path)
		require.NoError(t, err, "SIDECAR_COMMAND")
		return path
	}
	path, err := filepath.Abs(filepath.Join(Dir(), "..", "..", "..", ".venv", "bin", "gpumetrics"))
	require.NoError(t, err)
	if _, err := os.Stat(path); err != nil {
		t.Skipf("the gpumetrics sidecar is not installed (%v): set SIDECAR_COMMAND or run ./scripts/test.sh", err)
	}
	return path
}
