package execsvc

// BufferUse is what the service's buffer budgets hold now and held at most: frames and stdin,
// then the recorder's lines.
func BufferUse(s *Service) (buffers, buffersPeak, lines, linesPeak int64) {
	buffers, buffersPeak = s.buffers.stats()
	lines, linesPeak = s.lines.stats()
	return buffers, buffersPeak, lines, linesPeak
}

// SplitBuffers is the buffer budget's split: frames and stdin, lines.
var SplitBuffers = splitBuffers
