package baton

import (
	"os"
	"testing"

	"github.com/baton-dev/baton/clients/go/batontest"
)

// server is a real server on a data dir of its own; its gRPC address.
func server(t *testing.T) string {
	t.Helper()
	return batontest.Start(t).Addr
}

// startServer is [server] with its process, for signals.
func startServer(t *testing.T) (string, *os.Process) {
	t.Helper()
	s := batontest.Start(t)
	return s.Addr, s.Process
}
