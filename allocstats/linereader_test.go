package allocstats

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"testing/iotest"
)

func TestLineReader(t *testing.T) {
	tests := []struct {
		name  string
		input string
		max   int
		want  []string
		err   error // after the lines
	}{
		{"lines", "a\nbb\n\nccc\n", 8, []string{"a", "bb", "", "ccc"}, io.EOF},
		{"last line without newline", "a\nbb", 8, []string{"a", "bb"}, io.EOF},
		{"exactly the limit", "12345678\n1\n", 8, []string{"12345678", "1"}, io.EOF},
		{"over the limit", "12345678\n123456789\n", 8, []string{"12345678"}, errLineTooLong},
		{"over the limit without newline", "123456789", 8, nil, errLineTooLong},
		{"long lines grow the buffer", strings.Repeat("x", 10000) + "\ny\n", 10000, []string{strings.Repeat("x", 10000), "y"}, io.EOF},
		{"over a grown buffer", strings.Repeat("x", 10001) + "\n", 10000, nil, errLineTooLong},
	}
	for _, tt := range tests {
		for _, wrap := range []struct {
			name string
			f    func(io.Reader) io.Reader
		}{{"whole", func(r io.Reader) io.Reader { return r }}, {"bytewise", iotest.OneByteReader}} {
			t.Run(tt.name+"/"+wrap.name, func(t *testing.T) {
				lr := newLineReader(wrap.f(strings.NewReader(tt.input)), tt.max, nil)
				for i, w := range tt.want {
					got, err := lr.readLine()
					if err != nil || string(got) != w {
						t.Fatalf("line %d = %.20q, %v; want %.20q", i, got, err, w)
					}
				}
				if _, err := lr.readLine(); !errors.Is(err, tt.err) {
					t.Errorf("after the lines: err = %v, want %v", err, tt.err)
				}
				if cap(lr.line) > tt.max || len(lr.chunk) > tt.max+1 {
					t.Errorf("buffers grew to %d and %d bytes, over max = %d", cap(lr.line), len(lr.chunk), tt.max)
				}
			})
		}
	}
}

// steps returns each of its reads in turn: data, or an error.
type steps []any

func (s *steps) Read(p []byte) (int, error) {
	if len(*s) == 0 {
		return 0, io.EOF
	}
	step := (*s)[0]
	*s = (*s)[1:]
	if err, ok := step.(error); ok {
		return 0, err
	}
	return copy(p, step.(string)), nil
}

// A passed read deadline is not sticky and keeps the unfinished line: the
// server moves the deadline and reads on.
func TestLineReaderReadsOnAfterADeadline(t *testing.T) {
	r := &steps{"a\nb", os.ErrDeadlineExceeded, "c\n"}
	lr := newLineReader(r, 8, nil)
	for i, want := range []struct {
		line string
		err  error
	}{{"a", nil}, {"", os.ErrDeadlineExceeded}, {"bc", nil}, {"", io.EOF}} {
		got, err := lr.readLine()
		if string(got) != want.line || !errors.Is(err, want.err) {
			t.Errorf("read %d = %q, %v; want %q, %v", i, got, err, want.line, want.err)
		}
	}
}
