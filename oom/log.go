package oom

// The log line of each report.

import (
	"time"

	"github.com/go-kit/log"

	"github.com/gpumem/gpumem_exporter/internal/ratelog"
)

// reportLog logs each report at warn (a ReportSink). Many processes
// running out of memory at once must not flood the log: beyond a burst,
// reports are logged at debug.
type reportLog struct {
	logger log.Logger
	logs   *ratelog.Limiter
}

func newReportLog(logger log.Logger) reportLog {
	return reportLog{logger: logger, logs: ratelog.Path("oom_report", 10, 6*time.Second)}
}

// Deliver implements ReportSink.
func (l reportLog) Deliver(rep Report) {
	kv := []any{
		"msg", "CUDA out of memory reported",
		"pid", rep.PID, "comm", rep.Comm, "gpu", rep.GPU, "uuid", rep.UUID,
		"cause", rep.Verdict.Cause,
		"requested_bytes", rep.RequestedBytes,
		"active_bytes", rep.Totals.ActiveBytes,
		"inactive_bytes", rep.Totals.InactiveBytes,
		"context_bytes", rep.Totals.ContextBytes,
	}
	if rep.Namespace != "" {
		kv = append(kv, "namespace", rep.Namespace, "pod", rep.Pod, "container", rep.Container)
	}
	if len(rep.Processes) > 0 && rep.Processes[0].NVMLListed {
		top := rep.Processes[0]
		kv = append(kv, "top_holder_pid", top.PID, "top_holder_comm", top.Comm, "top_holder_bytes", top.footprint())
	}
	kv = append(kv, "verdict", rep.Verdict.Summary, "remedy", rep.Verdict.Remedy)
	l.logs.Warn(l.logger).Log(kv...)
}
