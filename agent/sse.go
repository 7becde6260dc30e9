package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// sseReader reads the events of a server-sent event stream: the data of
// each event, its data lines joined by newlines. Event names, ids, retry
// fields and comments are read and left; a line of any other field means
// the answer is not server-sent events at all (an HTML page or a JSON
// document served as text/event-stream), which a lenient reader would
// take for an empty stream. Parsing is apart from I/O: it reads any
// io.Reader.
type sseReader struct {
	r    *bufio.Reader
	line []byte
	data []byte
	// hasData is set once the event being read has a data line (one
	// with an empty value counts).
	hasData bool
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 32<<10)}
}

// malformedError is an answer that does not speak the agent's protocol.
type malformedError struct{ what string }

func (e *malformedError) Error() string { return e.what }

func malformedf(format string, args ...any) *malformedError {
	return &malformedError{what: fmt.Sprintf(format, args...)}
}

// next returns the data of the next event that has any, io.EOF at the
// end of the stream. An event that the stream ends after its last
// complete line is dispatched; a line cut short is dropped.
func (s *sseReader) next() ([]byte, error) {
	for {
		line, err := s.readLine()
		switch {
		case errors.Is(err, io.EOF) && s.hasData:
			return s.dispatch(), nil
		case err != nil:
			return nil, err
		case len(line) == 0:
			if s.hasData {
				return s.dispatch(), nil
			}
			continue
		case line[0] == ':':
			continue
		}
		field, value, found := bytes.Cut(line, []byte(":"))
		if found && len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		switch string(field) {
		case "data":
			if s.hasData {
				s.data = append(s.data, '\n')
			}
			s.data = append(s.data, value...)
			s.hasData = true
		case "event", "id", "retry":
		default:
			return nil, malformedf("the answer is not server-sent events (a line reads %q)", truncate(string(line), 60))
		}
	}
}

func (s *sseReader) dispatch() []byte {
	out := s.data
	s.data, s.hasData = nil, false
	return out
}

// readLine reads one line without its end (LF or CRLF). At the end of the
// stream it returns io.EOF, and drops a last line that has no end: the
// stream was cut in the middle of it.
func (s *sseReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		chunk, err := s.r.ReadSlice('\n')
		s.line = append(s.line, chunk...)
		switch {
		case err == nil:
			return bytes.TrimSuffix(s.line[:len(s.line)-1], []byte("\r")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// capReader reads at most max bytes of r; past them it fails with
// *stepTooLargeError.
type capReader struct {
	r    io.Reader
	max  int64
	read int64
}

// stepTooLargeError is an answer longer than MaxStepBytes.
type stepTooLargeError struct{ max int64 }

func (e *stepTooLargeError) Error() string {
	return fmt.Sprintf("the answer to the step was longer than %d bytes", e.max)
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.read > c.max {
		return 0, &stepTooLargeError{max: c.max}
	}
	if room := c.max - c.read + 1; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := c.r.Read(p)
	c.read += int64(n)
	if c.read > c.max {
		return n - int(c.read-c.max), &stepTooLargeError{max: c.max}
	}
	return n, err
}
