package audit

import (
	"net/netip"
	"slices"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Allowlist is the smallest allowOut that covers what a trail saw: every
// host the sandbox reached or tried to reach, by the name it asked for
// (a TLS server name, an HTTP Host) or, where it named none, by the name
// it looked up for that address, or else the address itself. Reserved
// addresses (the host's network, metadata) are never proposed: a rule
// would open them. Denied lists those of them the sandbox's policy
// refused: what enforcing it would have cost the run.
type Allowlist struct {
	AllowOut []string `json:"allowOut"`
	Denied   []string `json:"denied"`
}

// Propose reads the allowlist off events (learning mode: a sandbox run
// with the internet, or under a policy to report on).
func Propose(events []Event) Allowlist {
	named := map[string]string{} // address → the name the sandbox looked up for it
	for _, e := range events {
		if e.Kind == "dns" && e.Decision == "allowed" {
			for _, a := range e.Answers {
				named[a] = e.Name
			}
		}
	}
	allow, denied := map[string]bool{}, map[string]bool{}
	for _, e := range events {
		if e.Kind != "connection" && e.Kind != "request" {
			continue
		}
		host := e.Name
		if host == "" {
			host = named[e.Addr]
		}
		if host == "" {
			a, err := netip.ParseAddr(e.Addr)
			if err != nil || policy.IsReserved(a) {
				continue
			}
			host = a.String()
		}
		allow[host] = true
		if e.Decision == "denied" {
			denied[host] = true
		}
	}
	out := Allowlist{AllowOut: []string{}, Denied: []string{}}
	for h := range allow {
		out.AllowOut = append(out.AllowOut, h)
	}
	for h := range denied {
		out.Denied = append(out.Denied, h)
	}
	slices.Sort(out.AllowOut)
	slices.Sort(out.Denied)
	return out
}

// OTLP types: the JSON encoding of OpenTelemetry's logs (LogsData), as a
// collector's OTLP/HTTP receiver takes it at /v1/logs.
type (
	otlpLogs struct {
		ResourceLogs []otlpResourceLogs `json:"resourceLogs"`
	}
	otlpResourceLogs struct {
		Resource  otlpResource    `json:"resource"`
		ScopeLogs []otlpScopeLogs `json:"scopeLogs"`
	}
	otlpResource struct {
		Attributes []otlpKV `json:"attributes"`
	}
	otlpScopeLogs struct {
		Scope      otlpScope    `json:"scope"`
		LogRecords []otlpRecord `json:"logRecords"`
	}
	otlpScope struct {
		Name string `json:"name"`
	}
	otlpRecord struct {
		TimeUnixNano   string    `json:"timeUnixNano"`
		SeverityNumber int       `json:"severityNumber"`
		SeverityText   string    `json:"severityText"`
		Body           otlpValue `json:"body"`
		Attributes     []otlpKV  `json:"attributes"`
	}
	otlpKV struct {
		Key   string    `json:"key"`
		Value otlpValue `json:"value"`
	}
	otlpValue struct {
		StringValue *string  `json:"stringValue,omitempty"`
		IntValue    *string  `json:"intValue,omitempty"` // int64 is a string in OTLP's JSON
		DoubleValue *float64 `json:"doubleValue,omitempty"`
		BoolValue   *bool    `json:"boolValue,omitempty"`
	}
)

func str(s string) otlpValue { return otlpValue{StringValue: &s} }
func num(n int64) otlpValue  { v := strconv.FormatInt(n, 10); return otlpValue{IntValue: &v} }

// OTLP returns sandbox id's events as OpenTelemetry logs: one record an
// event, a denial at WARN, everything else at INFO, the event's fields
// as attributes (airlock.*).
func OTLP(id string, events []Event) any {
	records := make([]otlpRecord, 0, len(events))
	for _, e := range events {
		sev, text := 9, "INFO"
		if e.Decision == "denied" || e.Kind == "budget" || e.Kind == "dropped" {
			sev, text = 13, "WARN"
		}
		body := e.Kind
		if e.Decision != "" {
			body += " " + e.Decision
		}
		var attrs []otlpKV
		add := func(k string, v otlpValue) { attrs = append(attrs, otlpKV{Key: "airlock." + k, Value: v}) }
		add("kind", str(e.Kind))
		for _, f := range []struct{ k, v string }{{"proto", e.Proto}, {"name", e.Name}, {"addr", e.Addr}, {"decision", e.Decision},
			{"rule", e.Rule}, {"actor", e.Actor}, {"action", e.Action}} {
			if f.v != "" {
				add(f.k, str(f.v))
			}
		}
		for _, f := range []struct {
			k string
			v int64
		}{{"port", int64(e.Port)}, {"sent", e.Sent}, {"received", e.Received}, {"status", int64(e.Status)}, {"count", e.Count}} {
			if f.v != 0 {
				add(f.k, num(f.v))
			}
		}
		if e.Millis != 0 {
			ms := e.Millis
			add("ms", otlpValue{DoubleValue: &ms})
		}
		if e.Intercepted {
			t := true
			add("intercepted", otlpValue{BoolValue: &t})
		}
		records = append(records, otlpRecord{TimeUnixNano: strconv.FormatInt(e.Time.UnixNano(), 10),
			SeverityNumber: sev, SeverityText: text, Body: str(body), Attributes: attrs})
	}
	return otlpLogs{ResourceLogs: []otlpResourceLogs{{
		Resource:  otlpResource{Attributes: []otlpKV{{Key: "service.name", Value: str("airlock")}, {Key: "airlock.sandbox.id", Value: str(id)}}},
		ScopeLogs: []otlpScopeLogs{{Scope: otlpScope{Name: "airlock.audit"}, LogRecords: records}},
	}}}
}
