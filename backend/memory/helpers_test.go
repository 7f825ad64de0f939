package memory_test

import registryv1 "github.com/aethermesh/aether/api/registry/v1"

func nodeRecord() *registryv1.Node {
	return &registryv1.Node{Name: "n1", Region: "r1", Cluster: "c1", Zone: "z1"}
}
