package endpointslice

import (
	rbacv1 "k8s.io/api/rbac/v1"
)

// RequiredRules are the permissions the reconciler uses, in the
// namespace it writes to (a Role, not a ClusterRole): it lists the slices
// it manages (by label selector, paged) and creates, updates and deletes
// them; with an Election (the registrar's default) it gets, creates and
// updates its Lease (client-go's LeaseLock). It reads no Services, Nodes
// or Pods, and watches nothing.
func RequiredRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{
			APIGroups: []string{"discovery.k8s.io"},
			Resources: []string{"endpointslices"},
			Verbs:     []string{"create", "delete", "list", "update"},
		},
		{
			APIGroups: []string{"coordination.k8s.io"},
			Resources: []string{"leases"},
			Verbs:     []string{"create", "get", "update"},
		},
	}
}
