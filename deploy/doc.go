// Package deploy holds the Kubernetes manifests (kustomize: base/, agent/,
// components/, overlays/) and the tests that keep them, and the repository's
// Dockerfile, true to the aether binary: every flag they pass exists, the
// RBAC is exactly what the backends use, and they apply to a real API
// server. See README.md here.
package deploy
