package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

type slotShareJSON struct {
	Region     string `json:"region"`
	Holder     string `json:"holder,omitempty"`
	Slots      int64  `json:"slots"`
	AdmitSlots int64  `json:"admit_slots"`
	HeldSlots  int64  `json:"held_slots"`
	ExpiresAt  string `json:"expires_at"`
	Seq        int64  `json:"seq"`
}

type slotWindowsJSON struct {
	Limit      string          `json:"limit"`
	Kind       string          `json:"kind"`
	Plan       string          `json:"plan,omitempty"`
	Override   *overrideJSON   `json:"override,omitempty"`
	LimitSlots int64           `json:"limit_slots"`
	Shares     []slotShareJSON `json:"shares"`
}

// printSlotWindows prints a concurrency limit's N and its slot shares in
// force (a concurrency limit has no windows), as a table or one JSON
// object.
func (e *env) printSlotWindows(id string, bk bucketWindows) error {
	if e.json {
		out := slotWindowsJSON{Limit: id, Kind: "concurrency", Plan: bk.plan, Override: overrideJSONOf(bk.overridden),
			LimitSlots: bk.limitSlots, Shares: []slotShareJSON{}}
		for _, s := range bk.shares {
			out.Shares = append(out.Shares, slotShareJSON{Region: s.GetRegion(), Holder: s.GetHolder(), Slots: s.GetSlots(),
				AdmitSlots: s.GetAdmitSlots(), HeldSlots: s.GetHeldSlots(), ExpiresAt: formatTS(s.GetExpiresAt()), Seq: s.GetSeq()})
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return fmt.Errorf("encode JSON: %v", err)
		}
		_, err = e.stdout.Write(append(b, '\n'))
		return err
	}
	var b bytes.Buffer
	var leased, held int64
	for _, s := range bk.shares {
		leased += s.GetSlots()
		held += s.GetHeldSlots()
	}
	fmt.Fprintf(&b, "concurrency limit %s: N %d (the bound at every instant), %d leased by the shares below, %d held as the regions last reported\n\n",
		oneLine(id), bk.limitSlots, leased, held)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tHOLDER\tSLOTS\tADMIT\tHELD\tEXPIRES_AT\tSEQ")
	for _, s := range bk.shares {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\n", cell(oneLine(s.GetRegion()), "-"), cell(oneLine(s.GetHolder()), "-"),
			s.GetSlots(), s.GetAdmitSlots(), s.GetHeldSlots(), cell(formatTS(s.GetExpiresAt()), "-"), s.GetSeq())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if l := overrideLine(bk.overridden); l != "" {
		b.WriteString("\n" + l)
	}
	if l := bk.planLine(); l != "" {
		b.WriteString("\n" + l)
	}
	_, err := io.Copy(e.stdout, &b)
	return err
}
