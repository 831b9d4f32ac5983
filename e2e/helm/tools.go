//go:build tools

// Package helm pins the Helm command used by the vgpu chart tests (test infrastructure only):
// e2e/build-helm.sh builds helm.sh/helm/v3/cmd/helm at the version go.mod requires.
package helm

import _ "helm.sh/helm/v3/cmd/helm"
