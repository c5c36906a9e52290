package app

import (
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/mintproto"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
)

// Access is one kind of Kubernetes request a worker's code makes. This table is the one place
// that says what each worker calls: the self-check asks the API server about it at start, and
// tests/deploy's RBAC test checks the overlay's RBAC allows exactly it.
type Access struct {
	Verb, Group, Resource, Subresource string
	// Name narrows the access to one object (the ClusterRoles the tenant-worker binds).
	Name string
	// Tenant: the worker makes it in tenant namespaces only, allowed by the RoleBinding the
	// tenant-worker creates in each (policy.RenderTenant). None exists before the first tenant,
	// so the self-check does not ask about these; the rest are cluster-wide grants.
	Tenant bool
}

// String names the access as the self-check logs it: verb, resource.group[/subresource] [name],
// and where ("in all namespaces", "in tenant namespaces", "cluster-wide" for cluster-scoped
// resources).
func (a Access) String() string {
	r := a.Resource
	if a.Group != "" {
		r += "." + a.Group
	}
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	if a.Name != "" {
		r += " " + a.Name
	}
	where := "in all namespaces"
	switch {
	case a.Tenant:
		where = "in tenant namespaces"
	case clusterScoped[a.Resource]:
		where = "cluster-wide"
	}
	return fmt.Sprintf("%s %s %s", a.Verb, r, where)
}

// clusterScoped are the cluster-scoped resources workers touch.
var clusterScoped = map[string]bool{"namespaces": true, "clusterroles": true}

// Attributes are the SelfSubjectAccessReview attributes of a cluster-wide access (namespace ""
// asks about every namespace).
func (a Access) Attributes() authorizationv1.ResourceAttributes {
	return authorizationv1.ResourceAttributes{Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource, Name: a.Name}
}

// accesses expands verbs on one resource.
func accesses(group, resource, subresource string, tenant bool, verbs ...string) []Access {
	out := make([]Access, 0, len(verbs))
	for _, v := range verbs {
		out = append(out, Access{Verb: v, Group: group, Resource: resource, Subresource: subresource, Tenant: tenant})
	}
	return out
}

// API groups the workers call.
const (
	groupBatch   = "batch"
	groupRBAC    = "rbac.authorization.k8s.io"
	groupNetwork = "networking.k8s.io"
	groupCilium  = "cilium.io"
	groupAgents  = "agents.x-k8s.io"
)

// KubernetesAccesses is what component calls in Kubernetes (see Access). rbacNameSuffix is the
// operator's --rbac-name-suffix: the tenant-worker binds the suffixed tenant ClusterRoles.
func KubernetesAccesses(component, rbacNameSuffix string) []Access {
	var a []Access
	add := func(group, resource, subresource string, tenant bool, verbs ...string) {
		a = append(a, accesses(group, resource, subresource, tenant, verbs...)...)
	}
	switch component {
	case "tenant-worker":
		// Server-side apply of a tenant: a patch, and a create for an object that is new. Its
		// ClusterRoleBinding grants it in every namespace; the admission policies narrow it.
		add("", "namespaces", "", false, "create", "patch", "get", "list", "watch")
		add("", "serviceaccounts", "", false, "create", "patch")
		add("", "resourcequotas", "", false, "create", "patch")
		add("", "limitranges", "", false, "create", "patch")
		// The credential broker's CA certificate (policy.BrokerCAConfigMap), with --broker-address.
		add("", "configmaps", "", false, "create", "patch")
		add(groupRBAC, "rolebindings", "", false, "create", "patch")
		add(groupNetwork, "networkpolicies", "", false, "create", "patch", "delete")
		add(groupCilium, "ciliumnetworkpolicies", "", false, "create", "patch", "delete")
		for _, role := range policy.WorkerTenantClusterRoles(policy.Operator{RBACNameSuffix: rbacNameSuffix}) {
			a = append(a, Access{Verb: "bind", Group: groupRBAC, Resource: "clusterroles", Name: role})
		}
	case "dispatcher":
		// The orphan reconcile pass and the warm pod cache, in every namespace.
		add(groupBatch, "jobs", "", false, "list")
		add("", "pods", "", false, "list", "watch")
		add(groupAgents, "sandboxes", "", false, "list")
		// A run's workload, Secret, volume and policies, in its tenant.
		add("", "secrets", "", true, "create", "get", "patch", "delete")
		add(groupBatch, "jobs", "", true, "create", "get", "delete")
		add("", "pods", "", true, "create", "get", "list", "watch", "update", "delete")
		add("", "persistentvolumeclaims", "", true, "create", "get", "patch", "delete")
		add(groupAgents, "sandboxes", "", true, "create", "get", "patch", "delete")
		add(groupNetwork, "networkpolicies", "", true, "create", "patch")
		add(groupCilium, "ciliumnetworkpolicies", "", true, "create", "patch")
	case "run-watcher":
		add(groupBatch, "jobs", "", false, "list", "watch")
		add("", "pods", "", false, "list", "watch")
		add("", "events", "", false, "list", "watch")
		add(groupAgents, "sandboxes", "", false, "list")
		add("", "pods", "log", true, "get")
	case "exec-worker":
		add("", "pods", "", false, "list", "watch")
		// --exec-route kube-exec: POST (SPDY) or GET (WebSocket) on pods/exec.
		add("", "pods", "exec", true, "create", "get")
		add("", "pods", "", true, "get")
	}
	return a
}

// kvStream is the stream behind a KV bucket.
func kvStream(bucket string) string { return "KV_" + bucket }

// natsNeeds is what component needs from NATS beyond what Start already did (it created the
// streams and buckets, so their CREATE and INFO were allowed): the subscriptions its code makes,
// the clients' inboxes its responders answer into, and read-only JetStream API calls on the
// streams, buckets and durable consumers it uses. Publishes to stream subjects (run events,
// dispatches, KV puts) are not probed: a probe would store data.
type natsNeeds struct {
	subscribe []string
	publish   []string
}

func (c *Common) natsNeeds(component string, s events.Subjects) natsNeeds {
	var n natsNeeds
	if component == "credential-broker" {
		// Its own user: no ping service, and answers into the plugin's inbox only (the CLI
		// does not mint). Its mint subscription, its bucket and its one consumer.
		n.subscribe = append(n.subscribe, mintproto.NewSubjects(s).MintFilter(), InboxPrefix(component)+".self-check")
		n.publish = append(n.publish, inbox.PaperclipPrefix+".self-check",
			jetstream.DefaultAPIPrefix+"STREAM.INFO."+kvStream(broker.Bucket),
			jetstream.DefaultAPIPrefix+"CONSUMER.INFO."+s.RunStream()+"."+events.BrokerReleaseConsumer)
		return n
	}
	n.subscribe = append(n.subscribe, api.PingSubject(s), InboxPrefix(component)+".self-check")
	for _, p := range c.clientInboxPrefixes() {
		n.publish = append(n.publish, p+".self-check")
	}
	streamInfo := func(stream string) { n.publish = append(n.publish, jetstream.DefaultAPIPrefix+"STREAM.INFO."+stream) }
	consumerInfo := func(stream, durable string) {
		n.publish = append(n.publish, jetstream.DefaultAPIPrefix+"CONSUMER.INFO."+stream+"."+durable)
	}
	switch component {
	case "tenant-worker":
		// Its queues service (api.ServeQueues) answers the status user's inbox too.
		n.subscribe = append(n.subscribe, api.ValidateSubject(s), api.QueuesSubject(s))
		n.publish = append(n.publish, inbox.StatusPrefix+".self-check")
		consumerInfo(s.LeaseStream(), events.TenantWorkerConsumer)
		streamInfo(events.RetryStream)
		consumerInfo(events.RetryStream, events.RetryConsumerConfig(events.TenantWorkerConsumer).Durable)
	case "dispatcher":
		consumerInfo(events.WorkStream, events.DispatcherConsumer)
		consumerInfo(s.LeaseStream(), events.DispatcherEndConsumer)
		consumerInfo(s.RunStream(), events.DispatcherResultConsumer)
		streamInfo(dispatch.ParkedStream)
		streamInfo(kvStream(dispatch.AgentBucket))
		// Asked whether warm pools are on or not: an operator who turns them on later needs it.
		streamInfo(kvStream(dispatch.WarmBucket))
	case "run-watcher":
		streamInfo(kvStream(runwatch.OwnershipBucket))
		streamInfo(kvStream(events.BudgetBucket))
	case "exec-worker":
		ex := execproto.NewSubjects(s)
		for _, op := range execproto.Ops() {
			n.subscribe = append(n.subscribe, ex.RequestFilter(op))
		}
		streamInfo(kvStream(execsvc.RecordedBucket))
		streamInfo(kvStream(events.BudgetBucket))
	}
	return n
}

// permissions are component's needs as the self-check's probes: its cluster-wide Kubernetes
// accesses and its NATS needs.
func (c *Common) permissions(component, rbacNameSuffix string, s events.Subjects, reviews ops.AccessReviewer, probes *ops.NATSProbes) []ops.Permission {
	var perms []ops.Permission
	for _, a := range KubernetesAccesses(component, rbacNameSuffix) {
		if !a.Tenant {
			perms = append(perms, ops.KubernetesAccess(reviews, a.String(), a.Attributes()))
		}
	}
	return append(perms, c.NATSPermissions(component, s, probes)...)
}

// NATSPermissions are component's NATS needs (natsNeeds) as probes.
func (c *Common) NATSPermissions(component string, s events.Subjects, probes *ops.NATSProbes) []ops.Permission {
	var perms []ops.Permission
	n := c.natsNeeds(component, s)
	for _, subj := range n.subscribe {
		perms = append(perms, probes.Subscribe(subj))
	}
	for _, subj := range n.publish {
		perms = append(perms, probes.Publish(subj))
	}
	return perms
}
