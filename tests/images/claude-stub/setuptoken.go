package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
)

// `claude setup-token`, as Paperclip's setup-token login drives it on a terminal
// (adapter-claude-local setup-token-runner.js and setup-token-parse.js): the sign-in screen (a
// preamble line, an authorization URL of the shape the parser accepts, with synthetic values,
// and the "Paste code here if prompted >" line), one line read from stdin (the browser code;
// on a terminal the Return arrives as CR, which the line discipline makes a newline), then the
// success screen with a token between the two anchor lines, exit 0. The token is
// StubSetupToken(code), so that a test can recognise what Paperclip stored without the stub
// keeping anything. An empty code or stdin at EOF is a failed login: exit 1.

// setupTokenURL is a well-formed authorization URL with synthetic values (no real client).
const setupTokenURL = "https://claude.com/cai/oauth/authorize?client_id=kubeclip-stub&code=true" +
	"&code_challenge=E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM&code_challenge_method=S256" +
	"&redirect_uri=https%3A%2F%2Fplatform.claude.com%2Foauth%2Fcode%2Fcallback&response_type=code" +
	"&scope=user%3Ainference&state=kubeclipStubState0123456789"

// setupTokenPrompt is the line the browser code is typed at.
const setupTokenPrompt = "Paste code here if prompted >"

// maxCodeBytes bounds the line read (a real code is under 200 bytes).
const maxCodeBytes = 4096

// StubSetupToken is the token the stub prints for a browser code.
func StubSetupToken(code string) string {
	sum := sha256.Sum256([]byte(code))
	return "sk-ant-oat01-kubeclipstub" + hex.EncodeToString(sum[:16])
}

// setupToken is the subcommand.
func setupToken(stdin io.Reader, stdout io.Writer) error {
	screen := "Welcome to Claude Code " + Version + "\n" +
		"Opening browser to sign in…\n" +
		"Browser didn't open? Use the url below to sign in (c to copy)\n" +
		setupTokenURL + "\n\n" +
		setupTokenPrompt + " "
	if _, err := io.WriteString(stdout, screen); err != nil {
		return err
	}
	line, err := bufio.NewReaderSize(io.LimitReader(stdin, maxCodeBytes), maxCodeBytes).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("reading the code: %w", err)
	}
	code := strings.TrimSpace(line)
	if code == "" {
		return errors.New("setup-token: no code was entered")
	}
	token := StubSetupToken(code)
	// The terminal wraps a long token; the parser joins the fragments between the anchors.
	_, err = fmt.Fprintf(stdout, "\n✓ Long-lived authentication token created successfully!\n\n"+
		"Your OAuth token (valid for 1 year):\n\n%s\n%s\n\n"+
		"Store this token securely. You won't be able to see it again.\n\n"+
		"Use this token by setting: export CLAUDE_CODE_OAUTH_TOKEN=<token>\n",
		token[:24], token[24:])
	return err
}
