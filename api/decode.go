package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// decodeJSON reads one JSON object from the body into v, rejecting unknown
// fields (a client sending "status" or "attempts" must not influence
// anything, and should learn that it was ignored), trailing data and bodies
// over limit bytes, and text that is not what was sent once decoded
// (invalid UTF-8, unpaired surrogates: see text.go). It writes the error response itself and reports
// whether decoding succeeded. An empty body decodes as {} when allowEmpty.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, allowEmpty bool, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the request body is over %d bytes", limit))
			return false
		}
		var bte *bodyTimeoutError
		if errors.As(err, &bte) {
			writeError(w, http.StatusRequestTimeout, "request_timeout", bte.Error())
			return false
		}
		writeError(w, http.StatusBadRequest, "bad_body", "could not read the request body: "+err.Error())
		return false
	}
	if terr := checkBodyText(body); terr != nil {
		writeTextError(w, terr)
		return false
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		if allowEmpty {
			return true
		}
		writeError(w, http.StatusBadRequest, "bad_json", "the request body is empty: send a JSON object")
		return false
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "bad_json", jsonErrorMessage(err))
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "bad_json", "the request body holds more than one JSON value: send exactly one object")
		return false
	}
	return true
}

func jsonErrorMessage(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return fmt.Sprintf("field %q must be a %s, not %s", typ.Field, typ.Type, typ.Value)
		}
		return fmt.Sprintf("the body must be a JSON object, not %s", typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return "unknown field " + field + ": the server decides statuses and attempts; send only the documented fields"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: the body ends early"
	}
	return "malformed JSON: " + err.Error()
}
