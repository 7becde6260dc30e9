package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/batonhq/baton/schema"
)

// Text a request may carry: JSON of valid UTF-8 whose escapes name whole
// characters. Go's JSON decoder turns invalid UTF-8 and an unpaired
// surrogate escape ("\ud800") into U+FFFD without a word, so that two
// different ids could become one stored id, and content would be stored
// other than it was sent: a body is checked as it is read, before it is
// decoded. U+0000 is valid JSON but no PostgreSQL text holds it: the
// strings that are stored are checked once decoded (checkText).

// textError is a request body, or a string in it, that holds text Baton
// does not take. It is answered 400 bad_text.
type textError struct{ message string }

func (e *textError) Error() string { return e.message }

func writeTextError(w http.ResponseWriter, err *textError) {
	writeError(w, http.StatusBadRequest, "bad_text", err.message)
}

// checkText refuses a string that is to be stored but cannot be: what
// schema.ValidateText refuses (U+0000).
func checkText(field, s string) *textError {
	if err := schema.ValidateText(field, s); err != nil {
		return &textError{message: err.Error()}
	}
	return nil
}

// checkJSONText refuses a JSON value with a string that holds U+0000: a
// JSON column of PostgreSQL cannot hold "\u0000" either.
func checkJSONText(field string, raw json.RawMessage) *textError {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // the end, or JSON that its own check refuses
		}
		if s, ok := tok.(string); ok && strings.IndexByte(s, 0) >= 0 {
			return &textError{message: field + " holds the character U+0000, which cannot be stored: remove it"}
		}
	}
}

// jsonText follows a JSON text byte by byte: whether it is valid UTF-8
// and whether its strings' \u escapes pair their surrogates. It knows
// strings and escapes, nothing else of JSON: the decoder judges the rest.
type jsonText struct {
	offset int64
	// rune is an incomplete UTF-8 sequence carried to the next bytes.
	rune  [utf8.UTFMax]byte
	nrune int
	// inString, escaped: where the scan is; hex counts the digits of a
	// \u escape read so far, whose value is code.
	inString, escaped bool
	hex               int
	code              rune
	// high is set after a high surrogate escape, which the next escape
	// must pair.
	high bool
}

func (j *jsonText) errorf(format string, args ...any) *textError {
	return &textError{message: fmt.Sprintf("the request body "+format+": send text as valid UTF-8 (JSON escapes of whole characters)", append(args, j.offset)...)}
}

// write scans the next bytes of the text.
func (j *jsonText) write(p []byte) *textError {
	for _, b := range p {
		if j.nrune > 0 || b >= utf8.RuneSelf {
			j.rune[j.nrune] = b
			j.nrune++
			if !utf8.FullRune(j.rune[:j.nrune]) {
				j.offset++
				continue
			}
			r, size := utf8.DecodeRune(j.rune[:j.nrune])
			if r == utf8.RuneError && size <= 1 {
				return j.errorf("is not valid UTF-8 at byte %d")
			}
			j.nrune = 0
			if err := j.char(0x80); err != nil {
				return err
			}
			j.offset++
			continue
		}
		if err := j.char(b); err != nil {
			return err
		}
		j.offset++
	}
	return nil
}

// end checks that the text did not stop inside a character.
func (j *jsonText) end() *textError {
	if j.nrune > 0 {
		return j.errorf("ends inside a UTF-8 character at byte %d")
	}
	return nil
}

// char takes one character of the text (any non-ASCII one as 0x80).
func (j *jsonText) char(b byte) *textError {
	switch {
	case !j.inString:
		j.inString = b == '"'
	case j.hex > 0:
		v, ok := hexValue(b)
		if !ok {
			// Not an escape: the decoder refuses it.
			j.hex = 0
			return nil
		}
		j.code = j.code<<4 | v
		if j.hex++; j.hex == 5 {
			j.hex = 0
			return j.escape()
		}
	case j.escaped:
		j.escaped = false
		if b == 'u' {
			j.hex, j.code = 1, 0
			return nil
		}
		if j.high {
			return j.errorf("holds an unpaired surrogate escape before byte %d")
		}
	case b == '\\':
		j.escaped = true
	case j.high:
		return j.errorf("holds an unpaired surrogate escape before byte %d")
	case b == '"':
		j.inString = false
	}
	return nil
}

// escape takes the value of a complete \u escape.
func (j *jsonText) escape() *textError {
	switch {
	case j.code >= 0xd800 && j.code <= 0xdbff:
		if j.high {
			return j.errorf("holds an unpaired surrogate escape before byte %d")
		}
		j.high = true
	case j.code >= 0xdc00 && j.code <= 0xdfff:
		if !j.high {
			return j.errorf("holds an unpaired surrogate escape (\\u%04x) before byte %d", j.code)
		}
		j.high = false
	case j.high:
		return j.errorf("holds an unpaired surrogate escape before byte %d")
	}
	return nil
}

func hexValue(b byte) (rune, bool) {
	switch {
	case b >= '0' && b <= '9':
		return rune(b - '0'), true
	case b >= 'a' && b <= 'f':
		return rune(b-'a') + 10, true
	case b >= 'A' && b <= 'F':
		return rune(b-'A') + 10, true
	}
	return 0, false
}

// checkBodyText checks a whole body's text.
func checkBodyText(body []byte) *textError {
	var j jsonText
	if err := j.write(body); err != nil {
		return err
	}
	return j.end()
}

// textReader checks a body's text as it is read: a read that meets text
// Baton does not take fails with a *textError.
type textReader struct {
	r    io.Reader
	scan jsonText
	err  error
}

func newTextReader(r io.Reader) *textReader { return &textReader{r: r} }

func (t *textReader) Read(p []byte) (int, error) {
	if t.err != nil {
		return 0, t.err
	}
	n, err := t.r.Read(p)
	if terr := t.scan.write(p[:n]); terr != nil {
		t.err = terr
		return 0, terr
	}
	if errors.Is(err, io.EOF) {
		if terr := t.scan.end(); terr != nil {
			t.err = terr
			return 0, terr
		}
	}
	return n, err
}
