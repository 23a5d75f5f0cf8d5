package diagnosis

import (
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	MiB  = uint64(1) << 20
	GiB_ = uint64(1) << 30
)

func p(v uint64) *uint64 { return &v }

// h200 is an H200 as NVML reports it: 150754820096 bytes, 615 MiB kept by
// the driver.
func h200(in Input) Input {
	in.Total, in.DriverReserved = 150754820096, 644939776
	return in
}

func self(reserved, active uint64) Process {
	return Process{PID: 100, Comm: "python3", Used: p(reserved + 520*MiB), Context: p(520 * MiB), Reserved: p(reserved), Active: p(active)}
}

func other(pid uint32, reserved, active, context uint64) Process {
	return Process{PID: pid, Comm: "python3", Namespace: "ml", Pod: "notebook-0", Container: "jupyter",
		Used: p(reserved + context), Context: p(context), Reserved: p(reserved), Active: p(active)}
}

// trend builds a trend whose floors and peaks go linearly from a to b.
func trend(span time.Duration, floorA, floorB, peakA, peakB uint64) Trend {
	t := Trend{Span: span}
	for i := 0; i < Segments; i++ {
		t.Floors[i] = floorA + (floorB-floorA)*uint64(i)/(Segments-1)
		t.Peaks[i] = peakA + (peakB-peakA)*uint64(i)/(Segments-1)
	}
	return t
}

func TestDiagnoseTheFiveKindsMeasuredOnAnH200(t *testing.T) {
	for _, tc := range []struct {
		name         string
		in           Input
		cause        Cause
		contributing []Cause
		says         []string // in the summary
	}{{
		// set_per_process_memory_fraction(0.05), a batch that grows each
		// step; dead within seconds: no trend yet.
		name:  "own limit",
		in:    h200(Input{Requested: 3822 * MiB, Limit: p(7 * GiB_), Free: p(139059 * MiB), Self: self(6*GiB_, 6*GiB_-64*MiB)}),
		cause: Limit,
		says:  []string{"own limit of 7.00 GiB", "3.73 GiB", "135.80 GiB free"},
	}, {
		// One 4 GiB segment, four 1 GiB tensors split from it, two freed,
		// then a 2 GiB request under a 5 GiB limit.
		name:         "fragmentation",
		in:           h200(Input{Requested: 2 * GiB_, Limit: p(5 * GiB_), Free: p(130 * GiB_), Self: Process{PID: 100, Reserved: p(4 * GiB_), Active: p(2 * GiB_), InactiveSplit: p(2 * GiB_), Context: p(520 * MiB)}}),
		cause:        Fragmentation,
		contributing: []Cause{Limit},
		says:         []string{"2.00 GiB inactive", "split segments", "limit of 5.00 GiB"},
	}, {
		// The seed's list append, 128 MiB a step, under a 5.6 GiB limit.
		name:         "leak",
		in:           h200(Input{Requested: 128 * MiB, Limit: p(5734 * MiB), Free: p(130 * GiB_), Self: self(5700*MiB, 5690*MiB), Trend: trend(130*time.Second, 1*GiB_, 5*GiB_, 1*GiB_+128*MiB, 5*GiB_+128*MiB)}),
		cause:        Leak,
		contributing: []Cause{Limit},
		says:         []string{"floor climbed from 1.00 GiB to 5.00 GiB", "2 minutes"},
	}, {
		// One 200 GiB request on a 140 GiB GPU.
		name:  "too large",
		in:    h200(Input{Requested: 200 * GiB_, Limit: p(150109880320), Free: p(139 * GiB_), Self: self(0, 0)}),
		cause: TooLarge,
		says:  []string{"200.00 GiB alone", "could never fit"},
	}, {
		// Another process allocated 115 GiB and freed it without
		// empty_cache(); this one asks for 40 GiB with 23.5 GiB free.
		name: "neighbour's cache",
		in: h200(Input{Requested: 40 * GiB_, Limit: p(150109880320), Free: p(23*GiB_ + 512*MiB), Self: self(0, 0),
			Others: []Process{other(200, 115*GiB_, 0, 520*MiB)}}),
		cause: Neighbours,
		says:  []string{"23.50 GiB free", "16.50 GiB short", "pid 200 (python3) in pod ml/notebook-0", "inactive 115.00 GiB"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			v := Diagnose(tc.in)
			if v.Cause != tc.cause {
				t.Fatalf("cause %q, want %q (summary %q)", v.Cause, tc.cause, v.Summary)
			}
			if !slices.Equal(v.Contributing, tc.contributing) {
				t.Errorf("contributing %v, want %v", v.Contributing, tc.contributing)
			}
			for _, s := range tc.says {
				if !strings.Contains(v.Summary, s) {
					t.Errorf("summary %q does not say %q", v.Summary, s)
				}
			}
			if v.Remedy == "" || v.Figures["requested_bytes"] != tc.in.Requested {
				t.Errorf("remedy %q, figures %v: want a remedy and the request among the figures", v.Remedy, v.Figures)
			}
		})
	}
}

func TestDiagnoseNeighboursNamesHoldersAndWhatEmptyCacheGivesBack(t *testing.T) {
	in := h200(Input{Requested: 40 * GiB_, Free: p(23*GiB_ + 512*MiB), Self: self(0, 0),
		Others: []Process{other(201, 10*GiB_, 10*GiB_, 700*MiB), other(200, 115*GiB_, 0, 520*MiB)}})
	v := Diagnose(in)
	if v.Cause != Neighbours || len(v.Holders) != 2 || v.Holders[0].PID != 200 {
		t.Fatalf("got %q with holders %+v; want neighbours, pid 200 first (the larger)", v.Cause, v.Holders)
	}
	if h := v.Holders[0]; h.Inactive == nil || *h.Inactive != 115*GiB_ || *h.Context != 520*MiB {
		t.Errorf("holder split %+v: want context 520 MiB, inactive 115 GiB", h)
	}
	if !strings.Contains(v.Remedy, "empty_cache() in pid 200") || !strings.Contains(v.Remedy, "115.00 GiB") {
		t.Errorf("remedy %q does not name pid 200 and its 115 GiB of cache", v.Remedy)
	}
}

// A neighbours remedy says whether emptying a neighbour's cache covers the
// shortfall: alone, only with the others', or not at all.
func TestNeighboursRemedySaysWhetherEmptyCacheIsEnough(t *testing.T) {
	for _, tc := range []struct {
		name            string
		requested, free uint64
		others          []Process
		says, not       []string
	}{{
		name:      "the largest cache covers the shortfall alone",
		requested: 40 * GiB_, free: 23*GiB_ + 512*MiB,
		others: []Process{other(200, 30*GiB_, 0, 520*MiB), other(201, 60*GiB_, 55*GiB_, 520*MiB)},
		says:   []string{"empty_cache() in pid 200", "30.00 GiB"},
		not:    []string{"not enough"},
	}, {
		name:      "only the caches together cover it",
		requested: 40 * GiB_, free: 23*GiB_ + 512*MiB,
		others: []Process{other(200, 10*GiB_, 0, 520*MiB), other(201, 40*GiB_, 30*GiB_, 520*MiB), other(202, 9*GiB_, 0, 520*MiB)},
		says:   []string{"empty_cache() in pid 201", "10.00 GiB", "not enough alone", "16.50 GiB the request was short", "29.00 GiB"},
	}, {
		// As measured in the simulated neighbours scenario: 24.85 GiB of
		// cache against a 47.92 GiB shortfall.
		name:      "no cache covers it",
		requested: 48 * GiB_, free: 80 * MiB,
		others: []Process{other(200, 24*GiB_+870*MiB, 0, 520*MiB), other(201, 80*GiB_, 80*GiB_, 520*MiB)},
		says:   []string{"empty_cache() in pid 200", "24.85 GiB", "not enough", "the request was short", "where the GPU has room"},
		not:    []string{"not enough alone"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			v := Diagnose(h200(Input{Requested: tc.requested, Free: p(tc.free), Self: self(0, 0), Others: tc.others}))
			if v.Cause != Neighbours {
				t.Fatalf("cause %q, want neighbours (summary %q)", v.Cause, v.Summary)
			}
			for _, s := range tc.says {
				if !strings.Contains(v.Remedy, s) {
					t.Errorf("remedy %q does not say %q", v.Remedy, s)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(v.Remedy, s) {
					t.Errorf("remedy %q says %q", v.Remedy, s)
				}
			}
		})
	}
}

func TestDiagnoseEdgesBetweenCauses(t *testing.T) {
	flat := trend(3*time.Minute, 10*GiB_, 10*GiB_, 20*GiB_, 20*GiB_)
	for _, tc := range []struct {
		name         string
		in           Input
		cause        Cause
		contributing []Cause
	}{{
		name:  "request just fits the limit: not too large",
		in:    h200(Input{Requested: 5 * GiB_, Limit: p(5 * GiB_), Free: p(100 * GiB_), Self: self(1*GiB_, 1*GiB_)}),
		cause: Limit,
	}, {
		name:  "request one byte over the limit: too large",
		in:    h200(Input{Requested: 5*GiB_ + 1, Limit: p(5 * GiB_), Free: p(100 * GiB_), Self: self(0, 0)}),
		cause: TooLarge,
	}, {
		name:  "limit equal to the GPU is no limit: alone on a full GPU",
		in:    h200(Input{Requested: 2 * GiB_, Limit: p(150109880320), Free: p(1 * GiB_), Self: self(137*GiB_, 137*GiB_)}),
		cause: Limit,
	}, {
		name:  "inactive one byte short of the request: not fragmentation",
		in:    h200(Input{Requested: 2 * GiB_, Limit: p(5 * GiB_), Free: p(100 * GiB_), Self: self(4*GiB_, 2*GiB_+1)}),
		cause: Limit,
	}, {
		name:         "a floor that climbed less than the overshoot is no leak",
		in:           h200(Input{Requested: 1 * GiB_, Limit: p(20 * GiB_), Free: p(100 * GiB_), Self: self(20*GiB_, 20*GiB_), Trend: trend(2*time.Minute, 19*GiB_+900*MiB, 20*GiB_, 20*GiB_, 20*GiB_)}),
		cause:        Limit,
		contributing: nil,
	}, {
		name:  "a floor that fell back is no leak",
		in:    h200(Input{Requested: 256 * MiB, Limit: p(20 * GiB_), Free: p(100 * GiB_), Self: self(20*GiB_, 20*GiB_), Trend: Trend{Span: time.Minute, Floors: [4]uint64{2 * GiB_, 10 * GiB_, 3 * GiB_, 19 * GiB_}, Peaks: [4]uint64{3 * GiB_, 11 * GiB_, 4 * GiB_, 20 * GiB_}}}),
		cause: Limit, contributing: []Cause{Growth},
	}, {
		name:         "peak climbing over a flat floor, no limit, alone: growth",
		in:           h200(Input{Requested: 4 * GiB_, Free: p(2 * GiB_), Self: self(136*GiB_, 134*GiB_), Trend: trend(4*time.Minute, 10*GiB_, 10*GiB_, 60*GiB_, 130*GiB_)}),
		cause:        Growth,
		contributing: []Cause{Limit},
	}, {
		name:         "a step larger than any before over a flat floor: growth",
		in:           h200(Input{Requested: 30 * GiB_, Free: p(10 * GiB_), Self: self(70*GiB_, 60*GiB_+1), Trend: flat}),
		cause:        Growth,
		contributing: []Cause{Limit},
	}, {
		// On the H200: 25 s of training at a 7 GiB peak over 2 GiB of
		// weights, then an evaluation without no_grad whose forward
		// passes filled the last quarter of the trend.
		name: "an evaluation that filled the last stretch: growth",
		in: h200(Input{Requested: 8 * GiB_, Free: p(547 * MiB), Self: self(138*GiB_+480*MiB, 138*GiB_),
			Trend: Trend{Span: 30 * time.Second, Floors: [4]uint64{2 * GiB_, 2 * GiB_, 2 * GiB_, 70 * GiB_}, Peaks: [4]uint64{7 * GiB_, 7 * GiB_, 7 * GiB_, 138 * GiB_}}}),
		cause:        Growth,
		contributing: []Cause{Limit},
	}, {
		// On the H200: training at a 3 GiB peak under a 6 GiB limit,
		// then an evaluation batch without no_grad.
		name: "an evaluation under its own limit: growth",
		in: h200(Input{Requested: 2 * GiB_, Limit: p(6 * GiB_), Free: p(100 * GiB_), Self: self(5*GiB_, 5*GiB_),
			Trend: Trend{Span: time.Minute, Floors: [4]uint64{2 * GiB_, 2 * GiB_, 2 * GiB_, 2 * GiB_}, Peaks: [4]uint64{3 * GiB_, 3 * GiB_, 3 * GiB_, 5 * GiB_}}}),
		cause:        Growth,
		contributing: []Cause{Limit},
	}, {
		name:         "a limit with a growing peak: the limit first",
		in:           h200(Input{Requested: 2 * GiB_, Limit: p(20 * GiB_), Free: p(100 * GiB_), Self: self(19*GiB_, 19*GiB_), Trend: trend(2*time.Minute, 5*GiB_, 5*GiB_, 10*GiB_, 19*GiB_)}),
		cause:        Limit,
		contributing: []Cause{Growth},
	}, {
		name: "usual step, a neighbour took the room: neighbours, not growth",
		in: h200(Input{Requested: 2 * GiB_, Free: p(1 * GiB_), Self: self(20*GiB_, 19*GiB_), Trend: flat,
			Others: []Process{other(300, 110*GiB_, 100*GiB_, 520*MiB)}}),
		cause: Neighbours,
	}, {
		name: "many processes, little cache among them: contexts",
		in: h200(func() Input {
			in := Input{Requested: 8 * GiB_, Free: p(5 * GiB_), Self: self(0, 0)}
			for i := 0; i < 16; i++ {
				in.Others = append(in.Others, other(uint32(400+i), 7*GiB_, 7*GiB_-10*MiB, 768*MiB))
			}
			return in
		}()),
		cause:        Contexts,
		contributing: []Cause{Neighbours},
	}, {
		name: "neighbours' cache covers the shortfall: neighbours before contexts",
		in: h200(func() Input {
			in := Input{Requested: 8 * GiB_, Free: p(5 * GiB_), Self: self(0, 0)}
			for i := 0; i < 16; i++ {
				in.Others = append(in.Others, other(uint32(400+i), 7*GiB_, 6*GiB_, 768*MiB))
			}
			return in
		}()),
		cause:        Neighbours,
		contributing: []Cause{Contexts},
	}, {
		name:  "room on the GPU, no limit exceeded: unknown",
		in:    h200(Input{Requested: 1 * GiB_, Free: p(50 * GiB_), Self: self(10*GiB_, 10*GiB_)}),
		cause: Unknown,
	}, {
		name:  "nothing known but the request: unknown",
		in:    Input{Requested: 1 * GiB_},
		cause: Unknown,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			v := Diagnose(tc.in)
			if v.Cause != tc.cause || !slices.Equal(v.Contributing, tc.contributing) {
				t.Fatalf("got %q (contributing %v), want %q (contributing %v); summary %q", v.Cause, v.Contributing, tc.cause, tc.contributing, v.Summary)
			}
			if v.Summary == "" || v.Remedy == "" {
				t.Errorf("empty summary or remedy: %+v", v)
			}
		})
	}
}

func TestEveryCauseHasItsOwnRemedy(t *testing.T) {
	seen := map[string]Cause{}
	f := derive(h200(Input{Requested: GiB_, Limit: p(2 * GiB_)}))
	for _, c := range Causes() {
		r := f.remedy(c, nil)
		if prev, dup := seen[r]; dup || r == "" {
			t.Errorf("cause %q has the remedy of %q: %q", c, prev, r)
		}
		seen[r] = c
		if !Valid(c) {
			t.Errorf("Valid(%q) is false", c)
		}
	}
	if Valid("oops") {
		t.Error(`Valid("oops") is true`)
	}
}

func TestGiBFormatsAsPyTorch(t *testing.T) {
	for b, want := range map[uint64]string{960495616: "916.00 MiB", 3822 * MiB: "3.73 GiB", 512: "512 bytes", 2048: "2.00 KiB"} {
		if got := GiB(b); got != want {
			t.Errorf("GiB(%d) = %q, want %q", b, got, want)
		}
	}
}
