// Package brokersvc is the credential broker's side of NATS and its accounting (issue 27): the
// mint service that turns a brokered key's real value into a lease's placeholder (Mint, over
// pkg/broker/mintproto), the consumer that releases a lease's grants when the run stream says
// it ended (Releaser), the proxy observer that meters every forwarded call from the
// upstream's own response (Usage), and the operator's per-company budgets it enforces before a
// call is forwarded (Budgets: requests per second per replica, tokens per day shared by every
// replica in KUBECLIP_BUDGETS). cmd/credential-broker wires them beside the grant cache and the
// proxy.
//
// Company and run ids are never metric labels (a label per company grows without bound);
// they go to the debug log beside each call's usage. Secrets (real values, placeholders) never
// go anywhere but the grant and the answer's inbox.
package brokersvc
