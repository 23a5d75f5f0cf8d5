package oom

import (
	"encoding/json"
	"fmt"

	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"github.com/gpumem/gpumem_exporter/diagnosis"
)

// verdictMessage is the daemon's answer to an oom message (protocol
// v1, type "verdict"): what the client prints to the process's stderr.
type verdictMessage struct {
	V              int               `json:"v"`
	Type           string            `json:"type"`
	UUID           string            `json:"uuid"`
	GPU            string            `json:"gpu,omitempty"`
	RequestedBytes uint64            `json:"requested_bytes"`
	Cause          diagnosis.Cause   `json:"cause"`
	Contributing   []diagnosis.Cause `json:"contributing,omitempty"`
	Summary        string            `json:"summary"`
	Remedy         string            `json:"remedy"`
	Figures        diagnosis.Figures `json:"figures,omitempty"`
	Report         string            `json:"report"` // where the whole report is served
}

// maxVerdictLine is the protocol's line limit (64 KiB): a verdict names at
// most three holders, so it stays far below.
const maxVerdictLine = 64 << 10

// VerdictReply answers the process that reported the OOM with its
// verdict, on the connection that sent the oom message (a ReportSink; a
// report without that connection gets nothing).
type VerdictReply struct{}

// Deliver implements ReportSink.
func (VerdictReply) Deliver(rep Report) {
	if rep.replyTo == nil {
		return
	}
	if line, err := VerdictLine(rep); err == nil {
		rep.replyTo.Reply(line)
	}
}

// VerdictLine is rep's verdict as one protocol line, newline included.
func VerdictLine(rep Report) ([]byte, error) {
	b, err := json.Marshal(verdictMessage{
		V: wire.ProtocolVersion, Type: "verdict",
		UUID: rep.UUID, GPU: rep.GPU, RequestedBytes: rep.RequestedBytes,
		Cause: rep.Verdict.Cause, Contributing: rep.Verdict.Contributing,
		Summary: rep.Verdict.Summary, Remedy: rep.Verdict.Remedy, Figures: rep.Verdict.Figures,
		Report: "/api/v1/oom-reports",
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the verdict: %w", err)
	}
	if len(b)+1 > maxVerdictLine {
		return nil, fmt.Errorf("verdict of %d bytes over the line limit", len(b))
	}
	return append(b, '\n'), nil
}
