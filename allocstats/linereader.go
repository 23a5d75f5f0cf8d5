package allocstats

import (
	"bytes"
	"errors"
	"io"
	"os"
	"time"
)

// errLineTooLong: a line exceeded the size limit.
var errLineTooLong = errors.New("line too long")

// readChunk is the fixed read buffer of a connection: all it holds while
// idle. A line that does not fit in one read is gathered in a separate
// buffer charged to the shared bufferBudget, and that buffer is dropped as
// soon as the line is complete.
const readChunk = 2048

// lineReader reads '\n'-terminated lines of at most max bytes.
type lineReader struct {
	r      io.Reader
	max    int
	budget *bufferBudget // nil: no shared budget (tests)

	chunk  []byte
	cs, ce int    // unread data is chunk[cs:ce]
	line   []byte // an unfinished line carried over from earlier reads
	done   bool   // line was returned: drop it at the next call
	err    error  // sticky read error, returned once the data is used up
	// reads counts the reads that returned data: every byte of a line
	// returned was received by read number reads or earlier.
	reads uint64

	// Guarded by budget.mu.
	charged int
	since   time.Time
	evicted bool
	onEvict func()
}

func newLineReader(r io.Reader, max int, budget *bufferBudget) *lineReader {
	return &lineReader{r: r, max: max, budget: budget, chunk: make([]byte, min(readChunk, max+1))}
}

// readLine returns the next line without its newline. The slice is valid
// until the next call. A last line without a newline is returned at EOF.
// A read deadline that passes is returned as os.ErrDeadlineExceeded, and
// reading may go on after it.
// It returns errLineTooLong when a line has more than max bytes, and
// errBufferBudget when the budget closed this connection.
func (lr *lineReader) readLine() ([]byte, error) {
	if lr.done {
		lr.done = false
		lr.dropLine()
	}
	for {
		if i := bytes.IndexByte(lr.chunk[lr.cs:lr.ce], '\n'); i >= 0 {
			part := lr.chunk[lr.cs : lr.cs+i]
			lr.cs += i + 1
			if lr.line == nil {
				if len(part) > lr.max {
					return nil, errLineTooLong
				}
				return part, nil
			}
			if err := lr.appendLine(part); err != nil {
				return nil, err
			}
			lr.done = true
			return lr.line, nil
		}
		if lr.cs < lr.ce {
			if err := lr.appendLine(lr.chunk[lr.cs:lr.ce]); err != nil {
				return nil, err
			}
		}
		lr.cs, lr.ce = 0, 0
		if lr.err != nil {
			if lr.line != nil {
				lr.done = true
				return lr.line, nil
			}
			return nil, lr.err
		}
		n, err := lr.r.Read(lr.chunk)
		lr.ce = n
		if n > 0 {
			lr.reads++
		}
		if err != nil {
			if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
				// Not sticky, and an unfinished line is kept: the caller
				// may move the deadline and read on.
				return nil, err
			}
			lr.err = err
		}
	}
}

// appendLine adds p to the unfinished line, within max and the budget.
func (lr *lineReader) appendLine(p []byte) error {
	need := len(lr.line) + len(p)
	if need > lr.max {
		return errLineTooLong
	}
	if need > cap(lr.line) {
		size := min(max(2*cap(lr.line), need, 256), lr.max)
		if lr.budget != nil {
			if err := lr.budget.charge(lr, size); err != nil {
				lr.line = nil
				return err
			}
		}
		nl := make([]byte, len(lr.line), size)
		copy(nl, lr.line)
		lr.line = nl
	}
	lr.line = append(lr.line, p...)
	return nil
}

// dropLine forgets the unfinished line and returns its budget.
func (lr *lineReader) dropLine() {
	lr.line = nil
	if lr.budget != nil {
		lr.budget.release(lr)
	}
}
