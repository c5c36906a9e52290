package meter

// field is one value the meter reads from a document. The counts come first so that they
// index Meter.count.
type field uint8

const (
	fieldInput field = iota
	fieldOutput
	fieldCacheRead
	fieldCacheWrite
	fieldModel
	fieldType
	fieldNone
)

// numCounts is the number of count fields, the ones before fieldModel.
const numCounts = fieldModel

// schemaPath is one dotted JSON path of a schema: a leaf fills a field, any other path is a
// prefix the scanner descends through to reach leaves.
type schemaPath struct {
	path  string
	field field
	leaf  bool
}

// schema is where one format states its usage, in one encoding (body or stream).
type schema struct {
	// paths holds every leaf and every proper prefix of a leaf except the root; a path's
	// index is its bit in scanner.seen and its slot in scanner.caps.
	paths []schemaPath
	index map[string]int
	// inputIncludesCache: the input count includes the cached tokens (OpenAI).
	inputIncludesCache bool
	// terminal holds the values of a stream event's top-level "type" that end the stream.
	terminal map[string]bool
}

// maxPaths bounds a schema's paths (the largest, anthropicStream, has 14): scanner.seen is a
// bit set of them and every scanner keeps a capture for each.
const maxPaths = 16

func newSchema(inputIncludesCache bool, terminal []string, leaves ...schemaPath) *schema {
	s := &schema{index: map[string]int{}, inputIncludesCache: inputIncludesCache, terminal: map[string]bool{}}
	for _, t := range terminal {
		s.terminal[t] = true
	}
	for _, l := range leaves {
		// Prefixes first, each once, so that a prefix's index is known before its leaves'.
		for i := 0; i < len(l.path); i++ {
			if l.path[i] == '.' {
				if _, ok := s.index[l.path[:i]]; !ok {
					s.index[l.path[:i]] = len(s.paths)
					s.paths = append(s.paths, schemaPath{path: l.path[:i], field: fieldNone})
				}
			}
		}
		l.leaf = true
		s.index[l.path] = len(s.paths)
		s.paths = append(s.paths, l)
	}
	if len(s.paths) > maxPaths {
		panic("meter: schema has more than maxPaths paths")
	}
	return s
}

func leaf(path string, f field) schemaPath { return schemaPath{path: path, field: f} }

// The schemas, one per format and encoding. Within one, a later leaf filling the same field
// as an earlier one wins when a document states both. They are built once and only read.
var (
	anthropicBody = newSchema(false, nil,
		leaf("model", fieldModel),
		leaf("usage.input_tokens", fieldInput),
		leaf("usage.output_tokens", fieldOutput),
		leaf("usage.cache_read_input_tokens", fieldCacheRead),
		leaf("usage.cache_creation_input_tokens", fieldCacheWrite),
	)
	anthropicStream = newSchema(false, []string{"message_stop"},
		leaf("type", fieldType),
		// message_start
		leaf("message.model", fieldModel),
		leaf("message.usage.input_tokens", fieldInput),
		leaf("message.usage.output_tokens", fieldOutput),
		leaf("message.usage.cache_read_input_tokens", fieldCacheRead),
		leaf("message.usage.cache_creation_input_tokens", fieldCacheWrite),
		// message_delta
		leaf("usage.input_tokens", fieldInput),
		leaf("usage.output_tokens", fieldOutput),
		leaf("usage.cache_read_input_tokens", fieldCacheRead),
		leaf("usage.cache_creation_input_tokens", fieldCacheWrite),
	)
	// Chat completions state usage at the same paths in the body and in each chunk; the end
	// of a stream is data: [DONE], which is not JSON (see Meter.dispatch).
	openAIChat = newSchema(true, nil,
		leaf("model", fieldModel),
		leaf("usage.prompt_tokens", fieldInput),
		leaf("usage.completion_tokens", fieldOutput),
		leaf("usage.prompt_tokens_details.cached_tokens", fieldCacheRead),
	)
	openAIResponsesBody = newSchema(true, nil,
		leaf("model", fieldModel),
		leaf("usage.input_tokens", fieldInput),
		leaf("usage.output_tokens", fieldOutput),
		leaf("usage.input_tokens_details.cached_tokens", fieldCacheRead),
	)
	openAIResponsesStream = newSchema(true, []string{"response.completed", "response.incomplete", "response.failed"},
		leaf("type", fieldType),
		leaf("response.model", fieldModel),
		leaf("response.usage.input_tokens", fieldInput),
		leaf("response.usage.output_tokens", fieldOutput),
		leaf("response.usage.input_tokens_details.cached_tokens", fieldCacheRead),
	)
)

func schemaFor(f Format, stream bool) *schema {
	switch {
	case f == AnthropicMessages && stream:
		return anthropicStream
	case f == AnthropicMessages:
		return anthropicBody
	case f == OpenAIChatCompletions:
		return openAIChat
	case f == OpenAIResponses && stream:
		return openAIResponsesStream
	case f == OpenAIResponses:
		return openAIResponsesBody
	}
	return nil
}
