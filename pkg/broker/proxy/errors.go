package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ErrorFormat is the shape of a model API's error body: the broker answers a refusal in the
// shape of the API the agent called, so its SDK shows the broker's message as it shows the
// API's own.
type ErrorFormat int

// The formats.
const (
	// ErrorsAnthropic: {"type":"error","error":{"type":"authentication_error","message":"…"}}.
	ErrorsAnthropic ErrorFormat = iota
	// ErrorsOpenAI: {"error":{"message":"…","type":"invalid_request_error","param":null,"code":"…"}}.
	ErrorsOpenAI
	// ErrorsGoogle: {"error":{"code":401,"message":"…","status":"UNAUTHENTICATED"}}.
	ErrorsGoogle
)

// OpenAI's error types (and codes) of a 429: a spent quota, and a rate limit, which its clients
// retry after Retry-After.
const (
	openAIQuota     = "insufficient_quota"
	openAIRateLimit = "rate_limit_exceeded"
)

// errorBody is an error answer's body in format f: status, the broker's code (the refusal's
// reason, "budget", "upstream") and the message.
func (f ErrorFormat) errorBody(status int, code, message string) []byte {
	return f.errorBodyAs(status, code, message, "")
}

// errorBodyAs is errorBody with OpenAI's own type and code for the error when openAIType is
// set (a budget's 429: insufficient_quota or rate_limit_exceeded, as OpenAI answers them).
func (f ErrorFormat) errorBodyAs(status int, code, message, openAIType string) []byte {
	var v any
	switch f {
	case ErrorsOpenAI:
		type body struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		}
		b := body{Message: message, Type: openAIErrorType(status), Code: "kubeclip_" + code}
		if openAIType != "" {
			b.Type, b.Code = openAIType, openAIType
		}
		v = map[string]body{"error": b}
	case ErrorsGoogle:
		type body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Status  string `json:"status"`
		}
		v = map[string]body{"error": {Code: status, Message: message, Status: googleStatus(status)}}
	default:
		type inner struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		}
		v = struct {
			Type  string `json:"type"`
			Error inner  `json:"error"`
		}{"error", inner{Type: anthropicType(status), Message: message}}
	}
	b, err := json.Marshal(v)
	if err != nil { // strings and ints always marshal
		return []byte(`{"error":{"message":"kubeclip broker: status ` + strconv.Itoa(status) + `"}}`)
	}
	return b
}

// anthropicType is Anthropic's error type for status (docs.anthropic.com, errors).
func anthropicType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

func openAIErrorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

func googleStatus(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return "UNAVAILABLE"
	}
	if status >= 500 {
		return "INTERNAL"
	}
	return "INVALID_ARGUMENT"
}
