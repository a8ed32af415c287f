package event

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func body(replace ...string) []byte {
	return []byte(strings.NewReplacer(replace...).Replace(validBody))
}

func TestDecodeAcceptsTheContractSample(t *testing.T) {
	ev, err := Decode([]byte(validBody), "3F0B1F7E-8C1A-4A55-9A51-5B0A7C2F9D10", "TransferCreated")
	if err != nil {
		t.Fatal(err)
	}
	want := Transfer{ID: "0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33", FromAccount: "acc_00001",
		ToAccount: "acc_00002", AmountMinor: 10000, Currency: "EUR"}
	if ev.ID != "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10" || ev.Type != TransferCreated || ev.Transfer != want {
		t.Errorf("got %+v", ev)
	}
	if len(ev.Fingerprint) != 32 {
		t.Errorf("fingerprint has %d bytes", len(ev.Fingerprint))
	}
}

func TestDecodeRejectsPoison(t *testing.T) {
	tests := []struct {
		name       string
		body       []byte
		messageID  string
		msgType    string
		wantReason string
	}{
		{"not JSON", []byte("hello"), "", "", "not a JSON event"},
		{"empty", nil, "", "", "not a JSON event"},
		{"array", []byte("[]"), "", "", "not a JSON event"},
		{"number eventId", []byte(`{"eventId": 42}`), "", "", "eventId must be a string, got a number"},
		{"not UTF-8", []byte{0xff, 0xfe}, "", "", "not UTF-8"},
		{"missing eventId", body(`"eventId":"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10",`, ""), "", "", "eventId"},
		{"eventId not a UUID", body("3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", "42"), "", "", "eventId"},
		{"unknown type", body("TransferCreated", "TransferExploded"), "", "", "unknown eventType"},
		{"message_id mismatch", body(), "0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33", "", "message_id"},
		{"type mismatch", body(), "", "TransferCompleted", "type property"},
		{"bad occurredAt", body("2026-07-10T12:00:00Z", "yesterday"), "", "", "occurredAt"},
		{"no data", []byte(`{"eventId":"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10","eventType":"TransferCreated","occurredAt":"2026-07-10T12:00:00Z"}`), "", "", "data is missing"},
		{"bad transferId", body("0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33", "t-1"), "", "", "transferId"},
		{"empty fromAccount", body(`"fromAccount":"acc_00001"`, `"fromAccount":""`), "", "", "fromAccount"},
		{"long toAccount", body("acc_00002", strings.Repeat("a", 65)), "", "", "toAccount"},
		{"control character", body("acc_00002", `acc\u0007`), "", "", "non-printable"},
		{"same accounts", body("acc_00002", "acc_00001"), "", "", "both"},
		{"zero amount", body("10000", "0"), "", "", "not positive"},
		{"negative amount", body("10000", "-5"), "", "", "not positive"},
		{"fractional amount", body("10000", "100.5"), "", "", "not an integer"},
		{"exponent amount", body("10000", "1e4"), "", "", "not an integer"},
		{"string amount", body("10000", `"10000"`), "", "", "not an integer"},
		{"missing amount", body(`"amountMinor":10000,`, ""), "", "", "amountMinor is missing"},
		{"overflowing amount", body("10000", "99999999999999999999"), "", "", "not an integer"},
		{"lower-case currency", body("EUR", "eur"), "", "", "currency"},
		{"long currency", body("EUR", "EURO"), "", "", "currency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.body, tt.messageID, tt.msgType)
			if err == nil {
				t.Fatal("decoded a poison message")
			}
			if c := ClassOf(t.Context(), err); c != ClassPoison {
				t.Errorf("class = %q, want poison", c)
			}
			if !strings.Contains(err.Error(), tt.wantReason) {
				t.Errorf("reason %q does not mention %q", err, tt.wantReason)
			}
		})
	}
}

func TestFingerprintIgnoresLayoutButNotContent(t *testing.T) {
	decode := func(b []byte) Event {
		t.Helper()
		ev, err := Decode(b, "", "")
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	a := decode([]byte(validBody))
	spaced := decode([]byte("  " + strings.ReplaceAll(validBody, `,"`, `,   "`) + "\n"))
	extra := decode(body(`"currency":"EUR"`, `"currency":"EUR","note":"ignored"`))
	other := decode(body("10000", "10001"))
	if !bytes.Equal(a.Fingerprint, spaced.Fingerprint) || !bytes.Equal(a.Fingerprint, extra.Fingerprint) {
		t.Error("layout or unknown fields changed the fingerprint")
	}
	if bytes.Equal(a.Fingerprint, other.Fingerprint) {
		t.Error("a different amount kept the fingerprint")
	}
}

// The inbox keeps fingerprints, so a new build must compute the same bytes
// for the same event, or a redelivery across an upgrade would be taken for
// a producer conflict.
func TestFingerprintIsStable(t *testing.T) {
	ev, err := Decode([]byte(validBody), "", "")
	if err != nil {
		t.Fatal(err)
	}
	fields := "TransferCreated\x002026-07-10T12:00:00Z\x000c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33\x00" +
		"acc_00001\x00acc_00002\x0010000\x00EUR\x00"
	sum := sha256.Sum256([]byte(fields))
	const pinned = "86f8bf7435ba0c7c9b6936465704d7fbdaf82ce87142c2e799deb7fead5f3732"
	if got := hex.EncodeToString(ev.Fingerprint); got != pinned || hex.EncodeToString(sum[:]) != pinned {
		t.Errorf("fingerprint %s, the fields hash to %x, pinned %s", got, sum, pinned)
	}
	// An account longer than the stack buffer takes the same path.
	long := strings.Repeat("é", 64)
	ev, err = Decode(body(`"acc_00001"`, `"`+long+`"`), "", "")
	if err != nil {
		t.Fatal(err)
	}
	sum = sha256.Sum256([]byte(strings.Replace(fields, "acc_00001", long, 1)))
	if !bytes.Equal(ev.Fingerprint, sum[:]) {
		t.Errorf("long account: fingerprint %x, want %x", ev.Fingerprint, sum)
	}
}

// A poison body still tells what it could: its eventId and type when they
// are valid, for the dead letter's log line; and a huge field is cut in the
// reason, not copied whole into errors and logs.
func TestDecodePoisonKeepsWhatCouldBeRead(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	tests := []struct {
		name           string
		body           []byte
		wantID         string
		wantType       string
		wantReasonSize int // at most
	}{
		{"negative amount", body("10000", "-100"), "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", TransferCreated, 200},
		{"unknown type", body("TransferCreated", "TransferExploded"), "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", "", 200},
		{"bad eventId", body("3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", "nope"), "", "", 200},
		{"1 MiB fromAccount", body(`"fromAccount":"acc_00001"`, `"fromAccount":"`+huge+`"`), "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", TransferCreated, 300},
		{"1 MiB eventType", body("TransferCreated", huge), "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", "", 300},
		{"1 MiB amount", body("10000", "1"+strings.Repeat("0", 1<<20)), "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", TransferCreated, 300},
	}
	for _, tt := range tests {
		ev, err := Decode(tt.body, "", "")
		if ClassOf(t.Context(), err) != ClassPoison {
			t.Errorf("%s: want poison, got %v", tt.name, err)
			continue
		}
		if ev.ID != tt.wantID || ev.Type != tt.wantType {
			t.Errorf("%s: read id %q, type %q; want %q, %q", tt.name, ev.ID, ev.Type, tt.wantID, tt.wantType)
		}
		if n := len(err.Error()); n > tt.wantReasonSize {
			t.Errorf("%s: reason of %d bytes, want at most %d", tt.name, n, tt.wantReasonSize)
		}
	}
}

const validBody = `{"eventId":"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10","eventType":"TransferCreated",
"occurredAt":"2026-07-10T12:00:00Z","data":{"transferId":"0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33",
"fromAccount":"acc_00001","toAccount":"acc_00002","amountMinor":10000,"currency":"EUR"}}`

// db parks a dead letter's event id in a uuid column only when IsUUID
// says so; anything else must not reach PostgreSQL's uuid parser.
func TestIsUUID(t *testing.T) {
	for s, want := range map[string]bool{
		"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10": true,
		"3F0B1F7E-8C1A-4A55-9A51-5B0A7C2F9D10": true,
		"3f0b1f7e8c1a4a559a515b0a7c2f9d10":     false, // PostgreSQL takes it; the contract does not
		"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d1g": false,
		"3f0b1f7e-8c1a-4a55-9a51_5b0a7c2f9d10": false,
		"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9dé":  false, // 36 bytes, 35 characters
		"":                                     false,
	} {
		if got := IsUUID(s); got != want {
			t.Errorf("IsUUID(%q) = %v, want %v", s, got, want)
		}
	}
}
