package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// The write-ahead log: segment files "edge.wal.<seq>" (seq decimal, zero
// padded so name order is seq order) beside the bbolt file. Each Append is
// one frame:
//
//	frame   = length uint32 | crc uint32 | payload        (big-endian)
//	crc     = CRC-32C over the 4 length bytes and the payload
//	payload = walVersion byte | count uint32 | count × record
//	record  = index uint64 | rev uint64 | id [32]byte | len uint32 | change
//
// One frame per batch makes the frame's checksum the batch's commit
// marker: a batch is in the log whole or, torn, not at all.
const (
	walPrefix     = FileName + ".wal."
	walVersion    = 1
	frameHeader   = 8
	walRecHeader  = 8 + 8 + 32 + 4
	minPayload    = 1 + 4 + walRecHeader
	maxFrameBytes = 1 << 31 // far above the server's request limit
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func segmentName(seq uint64) string { return fmt.Sprintf("%s%020d", walPrefix, seq) }

// encodeFrame appends recs' frame to buf.
func encodeFrame(buf []byte, recs []Record) []byte {
	start := len(buf)
	buf = append(buf, make([]byte, frameHeader)...)
	buf = append(buf, walVersion)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(recs)))
	for i := range recs {
		r := &recs[i]
		buf = binary.BigEndian.AppendUint64(buf, r.Index)
		buf = binary.BigEndian.AppendUint64(buf, uint64(r.Rev))
		buf = append(buf, r.ID[:]...)
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(r.Change)))
		buf = append(buf, r.Change...)
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(len(buf)-start-frameHeader))
	crc := crc32.Update(0, castagnoli, buf[start:start+4])
	crc = crc32.Update(crc, castagnoli, buf[start+frameHeader:])
	binary.BigEndian.PutUint32(buf[start+4:], crc)
	return buf
}

// frameAt checks the frame at off of data: its payload and total length
// when the header fits, the payload is inside data and the checksum holds.
func frameAt(data []byte, off int) (payload []byte, n int, ok bool) {
	if len(data)-off < frameHeader {
		return nil, 0, false
	}
	size := binary.BigEndian.Uint32(data[off:])
	if size < minPayload || size > maxFrameBytes || uint64(len(data)-off-frameHeader) < uint64(size) {
		return nil, 0, false
	}
	payload = data[off+frameHeader : off+frameHeader+int(size)]
	crc := crc32.Update(0, castagnoli, data[off:off+4])
	crc = crc32.Update(crc, castagnoli, payload)
	if crc != binary.BigEndian.Uint32(data[off+4:]) {
		return nil, 0, false
	}
	return payload, frameHeader + int(size), true
}

// decodePayload decodes a checksummed frame's records; the records'
// Change slices alias payload.
func decodePayload(payload []byte) ([]Record, error) {
	if payload[0] != walVersion {
		return nil, fmt.Errorf("unknown frame version %d", payload[0])
	}
	count := binary.BigEndian.Uint32(payload[1:])
	p := payload[5:]
	if count == 0 || uint64(count) > uint64(len(p))/walRecHeader {
		return nil, fmt.Errorf("bad record count %d", count)
	}
	recs := make([]Record, count)
	for i := range recs {
		if len(p) < walRecHeader {
			return nil, fmt.Errorf("record %d of %d truncated", i, count)
		}
		r := &recs[i]
		r.Index = binary.BigEndian.Uint64(p)
		r.Rev = int64(binary.BigEndian.Uint64(p[8:]))
		copy(r.ID[:], p[16:48])
		n := binary.BigEndian.Uint32(p[48:])
		p = p[walRecHeader:]
		if uint64(n) > uint64(len(p)) {
			return nil, fmt.Errorf("record %d of %d: change of %d bytes truncated", i, count, n)
		}
		r.Change, p = p[:n:n], p[n:]
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%d bytes after the last record", len(p))
	}
	return recs, nil
}

// errCorrupt marks a WAL that is damaged before its end: acknowledged
// batches after the damage would be lost, so recovery refuses to guess.
var errCorrupt = errors.New("corrupt write-ahead log")

// scanSegment decodes the frames of one segment's content, calling fn with
// each batch in order. It returns the length of the valid prefix. A frame
// that does not check out ends the log when nothing valid follows it (a
// torn last write: that batch was never acknowledged); when a valid frame
// does follow, acknowledged batches lie beyond the damage and scanSegment
// fails with errCorrupt.
func scanSegment(name string, data []byte, fn func([]Record) error) (valid int, err error) {
	off := 0
	for off < len(data) {
		payload, n, ok := frameAt(data, off)
		if !ok {
			// Anything that checks out beyond here means damage in the
			// middle, not a torn tail. A byte-wise search: frames are not
			// aligned, and a segment is bounded (segmentBytes plus a batch).
			for p := off + 1; p+frameHeader+minPayload <= len(data); p++ {
				if _, _, ok := frameAt(data, p); ok {
					return off, fmt.Errorf("%w %s: frame at offset %d is damaged and a valid frame follows at %d", errCorrupt, name, off, p)
				}
			}
			return off, nil
		}
		recs, err := decodePayload(payload)
		if err != nil {
			return off, fmt.Errorf("%w %s: frame at offset %d: %v", errCorrupt, name, off, err)
		}
		if err := fn(recs); err != nil {
			return off, fmt.Errorf("%s: frame at offset %d: %w", name, off, err)
		}
		off += n
	}
	return off, nil
}

// listSegments returns the sequence numbers of the WAL segments in dir, in
// order.
func listSegments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), walPrefix)
		if !ok {
			continue
		}
		seq, err := strconv.ParseUint(rest, 10, 64)
		if err != nil {
			continue // not ours (an editor's backup, say): leave it alone
		}
		seqs = append(seqs, seq)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	return seqs, nil
}

// createSegment creates segment seq empty and makes its directory entry
// durable, so a batch fdatasync'd into it is found after a power loss.
func createSegment(dir string, seq uint64) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, segmentName(seq)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create write-ahead log: %w", err)
	}
	if err := syncDir(dir); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("create write-ahead log: sync dir: %w", err)
	}
	return f, nil
}
