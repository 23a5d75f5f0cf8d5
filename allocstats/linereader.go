package allocstats

import (
	"bytes"
	"errors"
	"io"
)

// errLineTooLong: a line exceeded the size limit.
var errLineTooLong = errors.New("line too long")

// lineReader reads '\n'-terminated lines with a buffer that starts small and
// grows, by doubling, to at most max+1 bytes: one line of max bytes plus its
// newline. Unlike bufio.Reader it does not keep a large buffer for clients
// that send small lines.
type lineReader struct {
	r          io.Reader
	buf        []byte
	start, end int // unread data is buf[start:end]
	max        int
	err        error // sticky read error, returned once the data is used up
}

const initialLineBuffer = 4096

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{r: r, buf: make([]byte, min(initialLineBuffer, max+1)), max: max}
}

// readLine returns the next line without its newline. The slice is valid
// until the next call. A last line without a newline is returned at EOF.
// It returns errLineTooLong when a line has more than max bytes.
func (lr *lineReader) readLine() ([]byte, error) {
	scanned := 0 // bytes of buf[start:end] known to hold no newline
	for {
		if i := bytes.IndexByte(lr.buf[lr.start+scanned:lr.end], '\n'); i >= 0 {
			line := lr.buf[lr.start : lr.start+scanned+i]
			lr.start += scanned + i + 1
			if len(line) > lr.max {
				return nil, errLineTooLong
			}
			return line, nil
		}
		scanned = lr.end - lr.start
		if scanned > lr.max {
			return nil, errLineTooLong
		}
		if lr.err != nil {
			if scanned > 0 {
				line := lr.buf[lr.start:lr.end]
				lr.start = lr.end
				return line, nil
			}
			return nil, lr.err
		}
		if lr.end == len(lr.buf) {
			lr.makeRoom()
		}
		n, err := lr.r.Read(lr.buf[lr.end:])
		lr.end += n
		if err != nil {
			lr.err = err
		}
	}
}

// makeRoom moves unread data to the front, or grows the buffer when it is
// full of one unfinished line.
func (lr *lineReader) makeRoom() {
	if lr.start > 0 {
		n := copy(lr.buf, lr.buf[lr.start:lr.end])
		lr.start, lr.end = 0, n
		if lr.end < len(lr.buf) {
			return
		}
	}
	size := min(2*len(lr.buf), lr.max+1)
	nb := make([]byte, size)
	copy(nb, lr.buf[:lr.end])
	lr.buf = nb
}
