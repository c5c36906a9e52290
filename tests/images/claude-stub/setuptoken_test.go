package main

import (
	"regexp"
	"strings"
	"testing"
)

func TestSetupToken(t *testing.T) {
	t.Run("prints the sign-in screen, reads the code and prints its token between the anchors", func(t *testing.T) {
		// As the terminal delivers it: the code, then the Return (CR, made a newline by the pty).
		stdout, _, err := stubRun(t, []string{"setup-token"}, nil, "browser-code-123\r\n")
		if err != nil {
			t.Fatalf("setup-token: %v", err)
		}
		before, after, ok := strings.Cut(stdout, setupTokenPrompt+" ")
		if !ok {
			t.Fatalf("no prompt in %q", stdout)
		}
		if !strings.Contains(before, "Use the url below to sign in") || !strings.Contains(before, "\n"+setupTokenURL+"\n") {
			t.Errorf("the sign-in screen lacks the preamble or the URL line: %q", before)
		}
		token := StubSetupToken("browser-code-123")
		if !regexp.MustCompile(`^sk-ant-oat01-[A-Za-z0-9_-]{20,}$`).MatchString(token) {
			t.Errorf("token %q is not of the shape Paperclip's parser accepts", token)
		}
		want := "Your OAuth token (valid for 1 year):\n\n" + token[:24] + "\n" + token[24:] + "\n\nStore this token securely. You won't be able to see it again.\n"
		if !strings.Contains(after, want) {
			t.Errorf("after the prompt:\n%s\nwant it to contain:\n%s", after, want)
		}
		if StubSetupToken("another") == token {
			t.Error("the token does not depend on the code")
		}
	})
	t.Run("an empty code fails the login", func(t *testing.T) {
		for _, stdin := range []string{"", "\r\n"} {
			stdout, _, err := stubRun(t, []string{"setup-token"}, nil, stdin)
			if err == nil || !strings.Contains(err.Error(), "no code was entered") {
				t.Errorf("stdin %q: err = %v, want no code was entered", stdin, err)
			}
			if strings.Contains(stdout, "sk-ant-") {
				t.Errorf("stdin %q: a token was printed", stdin)
			}
		}
	})
}
