package event

import "testing"

// BenchmarkDecode is the per-message cost of decoding, validating and
// fingerprinting a TransferCreated (go test -bench Decode ./consumer).
func BenchmarkDecode(b *testing.B) {
	body := []byte(validBody)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(body, "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", "TransferCreated"); err != nil {
			b.Fatal(err)
		}
	}
}
