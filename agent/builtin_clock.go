package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Clock is a read tool that tells the current time, in UTC or in the IANA
// time zone the model asks for. Models do not know what time it is.
// now defaults to time.Now.
func Clock(now func() time.Time) Tool {
	if now == nil {
		now = time.Now
	}
	return Tool{
		Name:        "clock",
		Version:     "1",
		Description: "Returns the current date and time (RFC 3339), in UTC or in the given IANA time zone such as Europe/Paris.",
		Schema: json.RawMessage(`{
			"type": "object",
			"properties": {"time_zone": {"type": "string", "description": "IANA time zone name; UTC when left out"}},
			"additionalProperties": false
		}`),
		Effect: Read,
		Handler: func(_ context.Context, inv Invocation) (string, error) {
			var args struct {
				TimeZone string `json:"time_zone"`
			}
			if err := json.Unmarshal(inv.Arguments, &args); err != nil {
				return "", err
			}
			loc := time.UTC
			if args.TimeZone != "" {
				var err error
				if loc, err = time.LoadLocation(args.TimeZone); err != nil {
					return "", fmt.Errorf("unknown time zone %q: give an IANA name such as America/New_York", args.TimeZone)
				}
			}
			t := now().In(loc)
			return t.Format(time.RFC3339) + " (" + t.Weekday().String() + ")", nil
		},
	}
}
