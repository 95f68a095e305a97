package agio

import (
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

func TestOutputSchemaJSONTakesTextAsItIsAndEncodesValues(t *testing.T) {
	for _, schema := range []any{`{"type":"object"}`, []byte(`{"type":"object"}`), json.RawMessage(`{"type":"object"}`), map[string]any{"type": "object"}} {
		text, err := OutputSchemaJSON(schema)
		if err != nil || text != `{"type":"object"}` {
			t.Errorf("OutputSchemaJSON(%#v) = %q, %v", schema, text, err)
		}
	}
	if _, err := OutputSchemaJSON(func() {}); err == nil {
		t.Error("a function is no schema")
	}
}

func TestDecodeOutputFillsAStructAndRefusesARunWithoutOutput(t *testing.T) {
	value, err := structpb.NewValue(map[string]any{"city": "Paris", "population": 2100000})
	if err != nil {
		t.Fatal(err)
	}
	var city struct {
		City       string `json:"city"`
		Population int    `json:"population"`
	}
	if err := DecodeOutput(&agiov1.Run{Output: value}, &city); err != nil || city.City != "Paris" || city.Population != 2100000 {
		t.Errorf("decoded %+v, %v", city, err)
	}
	if err := DecodeOutput(&agiov1.Run{Id: "run_1"}, &city); err == nil {
		t.Error("a run without output decoded")
	}
	if _, ok := Output(&agiov1.Run{}); ok {
		t.Error("a run without output has one")
	}
}
