package report

import (
	"encoding/json"
	"io"
	"time"
)

// SchemaVersion names the JSON schema of a Report. Fields are only added
// within a version; a change of meaning bumps it.
const SchemaVersion = "nettrace-report/1"

// Report is what Build found in a recording.
type Report struct {
	Schema string `json:"schema"`
	// Incomplete says why the recording is cut short, "" when complete.
	Incomplete string    `json:"incomplete,omitempty"`
	Recording  Recording `json:"recording"`
	// Filter is the after-the-fact selection applied, "" for none.
	Filter   string         `json:"filter,omitempty"`
	Probes   []ProbeSummary `json:"probes"`
	Findings []Finding      `json:"findings"`
	Drops    Drops          `json:"drops"`
	NAPI     NAPI           `json:"napi"`
	Stages   []Stage        `json:"stages"`
	// Counters lists every counter that moved during the recording.
	Counters  []CounterDelta `json:"counters"`
	Intervals []Interval     `json:"intervals"`
	// Rates counts events per probe over time.
	Rates Series `json:"rates"`
	// Untracked counts packets the stage analysis stopped following
	// because more than MaxInFlight were in flight.
	Untracked uint64 `json:"untracked,omitempty"`
}

// Recording describes the recording.
type Recording struct {
	Tool     string        `json:"tool"`
	Kernel   string        `json:"kernel"`
	Hostname string        `json:"hostname"`
	Command  []string      `json:"command,omitempty"`
	Mode     string        `json:"mode"`
	Filter   string        `json:"filter,omitempty"` // the recorder's in-kernel filter
	Start    time.Time     `json:"start"`
	Duration time.Duration `json:"duration_ns"`
	Stopped  string        `json:"stopped,omitempty"`
	Notes    []string      `json:"notes,omitempty"`
}

// ProbeSummary counts one probe's events.
type ProbeSummary struct {
	Name   string `json:"name"`
	Attach string `json:"attach"`
	// Events were written to the file; Seen passed the recorder's filters
	// in the kernel; Lost were seen but not written.
	Events    uint64  `json:"events"`
	Seen      uint64  `json:"seen"`
	Lost      uint64  `json:"lost"`
	LostShare float64 `json:"lost_share"`
}

// Finding is one conclusion of the rule base.
type Finding struct {
	Rule        string   `json:"rule"`
	Severity    string   `json:"severity"` // "error", "warning", "info"
	Title       string   `json:"title"`
	Count       uint64   `json:"count"`
	Evidence    []string `json:"evidence"`
	Explanation string   `json:"explanation"`
	Fix         string   `json:"fix"`
}

// Drops summarises dropped packets: kfree_skb, XDP exceptions and failed
// XDP redirects.
type Drops struct {
	Total      uint64 `json:"total"`
	ByReason   []Row  `json:"by_reason"`
	ByLocation []Row  `json:"by_location"`
	ByDevice   []Row  `json:"by_device"`
	ByFlow     []Row  `json:"by_flow"`
	// OverTime counts drops per reason per time bucket.
	OverTime Series `json:"over_time"`
}

// Row is one line of a top-N table.
type Row struct {
	Key    string  `json:"key"`
	Reason string  `json:"reason,omitempty"` // by_flow and by_location: the main reason
	Count  uint64  `json:"count"`
	Rate   float64 `json:"rate_per_s"`
	First  float64 `json:"first_s"` // seconds from the start
	Last   float64 `json:"last_s"`
}

// Series is a set of counts per time bucket.
type Series struct {
	Bucket time.Duration       `json:"bucket_ns"`
	Counts map[string][]uint64 `json:"counts"`
}

// NAPI summarises NAPI polls and softirqs.
type NAPI struct {
	Polls []NapiRow `json:"polls"`
	// Work is the distribution of work per poll over every device: index
	// i counts polls that handled i packets (the last index: budget or more).
	Work    []uint64     `json:"work"`
	Softirq []SoftirqRow `json:"softirq"`
	Softnet []SoftnetRow `json:"softnet"`
}

// NapiRow is one device on one CPU.
type NapiRow struct {
	Device string `json:"device"`
	CPU    uint32 `json:"cpu"`
	Polls  uint64 `json:"polls"`
	Work   uint64 `json:"work"`
	Budget int32  `json:"budget"`
	// Exhausted counts polls that used their whole budget: the device had
	// more to give and had to wait for the next round.
	Exhausted uint64 `json:"exhausted"`
}

// SoftirqRow is one softirq vector on one CPU.
type SoftirqRow struct {
	CPU    uint32  `json:"cpu"`
	Vec    string  `json:"vec"`
	Raised uint64  `json:"raised"`
	Runs   uint64  `json:"runs"`
	Time   Latency `json:"time"` // entry to exit
}

// SoftnetRow is /proc/net/softnet_stat's change for one CPU.
type SoftnetRow struct {
	CPU         string `json:"cpu"`
	Processed   uint64 `json:"processed"`
	Dropped     uint64 `json:"dropped"` // backlog full
	TimeSqueeze uint64 `json:"time_squeeze"`
}

// Stage is the time between two points of a packet's path.
type Stage struct {
	Name    string  `json:"name"`
	From    string  `json:"from"`
	To      string  `json:"to"`
	Latency Latency `json:"latency"`
}

// CounterDelta is how much a counter moved.
type CounterDelta struct {
	Source string `json:"source"`
	Device string `json:"device,omitempty"`
	Netns  uint32 `json:"netns,omitempty"`
	Name   string `json:"name"`
	Delta  uint64 `json:"delta"`
}

// Interval is the time between two counter snapshots in which something
// moved.
type Interval struct {
	Start    float64           `json:"start_s"`
	End      float64           `json:"end_s"`
	Drops    map[string]uint64 `json:"drops,omitempty"` // kernel drops by reason
	Counters []CounterDelta    `json:"counters,omitempty"`
	// Notes say which drops and counters moved together, and why.
	Notes []string `json:"notes,omitempty"`
}

// WriteJSON writes the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
