package events

// DecodeAcquire decodes and validates an acquire request received on subject. Every problem is
// a TerminalError (CodeInvalidRequest) naming the field: malformed JSON, a wrong type, a failed
// Validate, or a payload companyId that differs from the subject's.
func (s Subjects) DecodeAcquire(subject string, data []byte) (AcquireRequest, error) {
	companyID, kind, err := s.ParseLeaseSubject(subject)
	if err != nil {
		return AcquireRequest{}, asInvalidSubject(err)
	}
	if kind != LeaseAcquire {
		return AcquireRequest{}, InvalidRequest("", "subject %q is a %s request, not an acquire", subject, kind)
	}
	var r AcquireRequest
	if err := decode(data, &r); err != nil {
		return AcquireRequest{}, err
	}
	if err := r.Validate(); err != nil {
		return AcquireRequest{}, err
	}
	return r, matchSubject(r.CompanyID, companyID, "", "")
}

// DecodeRelease decodes and validates a release or destroy request received on subject; Destroy
// is set from the subject.
func (s Subjects) DecodeRelease(subject string, data []byte) (ReleaseRequest, error) {
	companyID, kind, err := s.ParseLeaseSubject(subject)
	if err != nil {
		return ReleaseRequest{}, asInvalidSubject(err)
	}
	if kind != LeaseRelease && kind != LeaseDestroy {
		return ReleaseRequest{}, InvalidRequest("", "subject %q is an %s request, not a release or destroy", subject, kind)
	}
	var r ReleaseRequest
	if err := decode(data, &r); err != nil {
		return ReleaseRequest{}, err
	}
	r.Destroy = kind == LeaseDestroy
	if err := r.Validate(); err != nil {
		return ReleaseRequest{}, err
	}
	return r, matchSubject(r.CompanyID, companyID, "", "")
}

// DecodeResume decodes and validates a resume request received on subject.
func (s Subjects) DecodeResume(subject string, data []byte) (ResumeRequest, error) {
	companyID, kind, err := s.ParseLeaseSubject(subject)
	if err != nil {
		return ResumeRequest{}, asInvalidSubject(err)
	}
	if kind != LeaseResume {
		return ResumeRequest{}, InvalidRequest("", "subject %q is a %s request, not a resume", subject, kind)
	}
	var r ResumeRequest
	if err := decode(data, &r); err != nil {
		return ResumeRequest{}, err
	}
	if err := r.Validate(); err != nil {
		return ResumeRequest{}, err
	}
	return r, matchSubject(r.CompanyID, companyID, "", "")
}

// DecodeDispatch decodes and validates a dispatch request received on subject.
func DecodeDispatch(subject string, data []byte) (DispatchRequest, error) {
	companyID, runID, err := ParseDispatchSubject(subject)
	if err != nil {
		return DispatchRequest{}, asInvalidSubject(err)
	}
	var r DispatchRequest
	if err := decode(data, &r); err != nil {
		return DispatchRequest{}, err
	}
	if err := r.Validate(); err != nil {
		return DispatchRequest{}, err
	}
	return r, matchSubject(r.CompanyID, companyID, r.RunID, runID)
}

// DecodeRunEvent decodes a run event received on subject into the payload type its kind names
// (RunCreatedEvent, RunStatusEvent, ...). It checks the ids against the subject but is lenient
// otherwise: run events come from kubeclip itself.
func (s Subjects) DecodeRunEvent(subject string, data []byte) (Event, error) {
	companyID, runID, kind, err := s.ParseRunSubject(subject)
	if err != nil {
		return nil, asInvalidSubject(err)
	}
	return decodeRunEvent(companyID, runID, kind, data)
}

// decodeRunEvent is DecodeRunEvent for a subject already parsed.
func decodeRunEvent(companyID, runID string, kind RunKind, data []byte) (Event, error) {
	var err error
	var ev Event
	switch kind {
	case KindCreated:
		var e RunCreatedEvent
		err, ev = decode(data, &e), &e
	case KindStatus:
		var e RunStatusEvent
		err, ev = decode(data, &e), &e
	case KindLog:
		if e, ok := decodeLogEvent(data); ok {
			ev = e
			break
		}
		var e RunLogEvent
		err, ev = decode(data, &e), &e
	case KindResult:
		var e RunResultEvent
		err, ev = decode(data, &e), &e
	case KindReleased:
		var e RunReleasedEvent
		err, ev = decode(data, &e), &e
	case KindFailed:
		var e RunFailedEvent
		err, ev = decode(data, &e), &e
	case KindExec:
		var e RunExecEvent
		err, ev = decode(data, &e), &e
	case KindSuspended:
		var e RunSuspendedEvent
		err, ev = decode(data, &e), &e
	case KindResumed:
		var e RunResumedEvent
		err, ev = decode(data, &e), &e
	case KindUsage:
		var e RunUsageEvent
		err, ev = decode(data, &e), &e
	}
	if err != nil {
		return nil, err
	}
	ev = deref(ev)
	c, r := ev.IDs()
	return ev, matchSubject(c, companyID, r, runID)
}

// deref turns the *T the decoder filled back into the T that implements Event.
func deref(ev Event) Event {
	switch e := ev.(type) {
	case *RunCreatedEvent:
		return *e
	case *RunStatusEvent:
		return *e
	case *RunLogEvent:
		return *e
	case *RunResultEvent:
		return *e
	case *RunReleasedEvent:
		return *e
	case *RunFailedEvent:
		return *e
	case *RunExecEvent:
		return *e
	case *RunSuspendedEvent:
		return *e
	case *RunResumedEvent:
		return *e
	case *RunUsageEvent:
		return *e
	}
	return ev
}

func matchSubject(payloadCompany, subjectCompany, payloadRun, subjectRun string) error {
	if payloadCompany != subjectCompany {
		return InvalidRequest("companyId", "is %q but the subject names company %q", truncate(payloadCompany, 64), subjectCompany)
	}
	if payloadRun != subjectRun {
		return InvalidRequest("runId", "is %q but the subject names run %q", truncate(payloadRun, 64), subjectRun)
	}
	return nil
}

// asInvalidSubject makes a subject parse failure terminal: redelivering cannot fix a subject.
func asInvalidSubject(err error) error {
	if _, ok := AsTerminal(err); ok {
		return err
	}
	return Terminal(CodeInvalidRequest, "", err)
}
