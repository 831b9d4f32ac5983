//go:build tools

// Package nfd pins node-feature-discovery for the vgpu NFD e2e test (test infrastructure only):
// e2e/build-nfd.sh builds its nfd-master and nfd-worker commands at the version go.mod requires.
package nfd

import (
	_ "sigs.k8s.io/node-feature-discovery/cmd/nfd-master"
	_ "sigs.k8s.io/node-feature-discovery/cmd/nfd-worker"
)
