package inbox

import "testing"

func TestAllows(t *testing.T) {
	r := MustRule(DefaultClientPrefixes()...)
	for _, tc := range []struct {
		reply string
		want  bool
	}{
		{"_INBOX_paperclip.abc", true},
		{"_INBOX_cli.abc.1", true},
		{"_INBOX_paperclip", false},
		{"_INBOX_paperclip.", false},
		{"_INBOX_paperclip..x", false},
		{"_INBOX_paperclipx.abc", false},
		{"_INBOX.abc", false},
		{"_INBOX_kubeclip.abc", false},
		{"_INBOX_exec.abc", false},
		{"$JS.API.STREAM.PURGE.KV_KUBECLIP_LEASES", false},
		{"$KV.KUBECLIP_LEASES.x", false},
		{"paperclip.run.acme.r1.failed", false},
		{"_INBOX_cli.*", false},
		{"_INBOX_cli.>", false},
		{"_INBOX_cli.a b", false},
		{"", false},
	} {
		if got := r.Allows(tc.reply); got != tc.want {
			t.Errorf("Allows(%q) = %v, want %v", tc.reply, got, tc.want)
		}
	}
	if (Rule{}).Allows("_INBOX_cli.abc") {
		t.Error("the zero Rule allows a reply")
	}
}

func TestNewRuleRefuses(t *testing.T) {
	for _, p := range []string{"", "$JS.API", "_INBOX.*", "a..b", ">", WorkersPrefix, ExecWorkerPrefix, "a b"} {
		if _, err := NewRule([]string{p}); err == nil {
			t.Errorf("NewRule(%q) accepted", p)
		}
	}
	if _, err := NewRule(nil); err == nil {
		t.Error("NewRule(nil) accepted")
	}
}
