// Command devalloc answers device allocations for Bindery's reference RM.
//
// It reads one JSON object per line on stdin and answers one per line on stdout. The RM keeps it
// running: "slices" and "classes" messages update its copy of the cluster's ResourceSlices and
// DeviceClasses (incrementally, by name), and an "allocate" message carries the claims of one
// reserve, the devices already in use and the candidate nodes in the RM's order. The answer is the
// first node on which every claim allocates, with the allocation results, or why none did.
// Allocation itself is upstream's structured allocator, so CEL, firstAvailable, constraints and
// consumable capacity behave exactly as kube-scheduler's DynamicResources plugin makes them behave.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// features are the ones the incubating allocator supports (the beta set of Kubernetes 1.36).
var features = structured.Features{
	AdminAccess:            true,
	ConsumableCapacity:     true,
	DeviceBindingAndStatus: true,
	DeviceTaints:           true,
	PartitionableDevices:   true,
	PrioritizedList:        true,
}

type usedDevice struct {
	Driver           string            `json:"driver"`
	Pool             string            `json:"pool"`
	Device           string            `json:"device"`
	ShareID          *string           `json:"shareID,omitempty"`
	ConsumedCapacity map[string]string `json:"consumedCapacity,omitempty"`
}

type message struct {
	Op string `json:"op"`
	// slices / classes: objects to upsert, names to delete
	Slices  []*resourceapi.ResourceSlice `json:"slices,omitempty"`
	Classes []*resourceapi.DeviceClass   `json:"classes,omitempty"`
	Deleted []string                     `json:"deleted,omitempty"`
	// allocate; Classes here are the classes as the caller resolved them, and win over the kept ones
	Claims []*resourceapi.ResourceClaim `json:"claims,omitempty"`
	Used   []usedDevice                 `json:"used,omitempty"`
	Nodes  []*v1.Node                   `json:"nodes,omitempty"`
}

type answer struct {
	OK          bool                           `json:"ok"`
	Node        string                         `json:"node,omitempty"`
	Allocations []resourceapi.AllocationResult `json:"allocations,omitempty"`
	// per node that could not allocate: why (upstream's message)
	Reasons map[string]string `json:"reasons,omitempty"`
	// a fatal problem (a selector that does not compile or evaluate): no node is tried further
	Error string `json:"error,omitempty"`
}

type classLister struct {
	classes map[string]*resourceapi.DeviceClass
}

func (l *classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l.classes))
	for _, c := range l.classes {
		out = append(out, c)
	}
	return out, nil
}

func (l *classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l.classes[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

type state struct {
	slices  map[string]*resourceapi.ResourceSlice
	classes *classLister
	cache   *cel.Cache
}

func (s *state) allocatedState(used []usedDevice) (structured.AllocatedState, error) {
	st := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, u := range used {
		id := structured.MakeDeviceID(u.Driver, u.Pool, u.Device)
		if u.ShareID == nil {
			st.AllocatedDevices.Insert(id)
			continue
		}
		uid := types.UID(*u.ShareID)
		st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, &uid))
		consumed := map[resourceapi.QualifiedName]resource.Quantity{}
		for name, value := range u.ConsumedCapacity {
			q, err := resource.ParseQuantity(value)
			if err != nil {
				return st, fmt.Errorf("used device %s: consumedCapacity %s: %w", id, name, err)
			}
			consumed[resourceapi.QualifiedName(name)] = q
		}
		st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, consumed))
	}
	return st, nil
}

func (s *state) allocate(ctx context.Context, m *message) answer {
	st, err := s.allocatedState(m.Used)
	if err != nil {
		return answer{Error: err.Error()}
	}
	names := make([]string, 0, len(s.slices))
	for name := range s.slices {
		names = append(names, name)
	}
	sort.Strings(names)
	slices := make([]*resourceapi.ResourceSlice, 0, len(names))
	for _, name := range names {
		slices = append(slices, s.slices[name])
	}
	classes := s.classes
	if len(m.Classes) > 0 {
		classes = &classLister{classes: map[string]*resourceapi.DeviceClass{}}
		for name, class := range s.classes.classes {
			classes.classes[name] = class
		}
		for _, class := range m.Classes {
			classes.classes[class.Name] = class
		}
	}
	allocator, err := structured.NewAllocator(ctx, features, st, classes, slices, s.cache)
	if err != nil {
		return answer{Error: err.Error()}
	}
	reasons := map[string]string{}
	for _, node := range m.Nodes {
		results, err := allocator.Allocate(ctx, node, m.Claims)
		if err != nil {
			if errors.Is(err, structured.ErrFailedAllocationOnNode) {
				reasons[node.Name] = err.Error()
				continue
			}
			return answer{Error: err.Error(), Reasons: reasons}
		}
		if results == nil {
			reasons[node.Name] = "cannot allocate all claims"
			continue
		}
		return answer{OK: true, Node: node.Name, Allocations: results}
	}
	return answer{Reasons: reasons}
}

func (s *state) handle(ctx context.Context, m *message) answer {
	switch m.Op {
	case "slices":
		for _, name := range m.Deleted {
			delete(s.slices, name)
		}
		for _, slice := range m.Slices {
			s.slices[slice.Name] = slice
		}
		return answer{OK: true}
	case "classes":
		for _, name := range m.Deleted {
			delete(s.classes.classes, name)
		}
		for _, class := range m.Classes {
			s.classes.classes[class.Name] = class
		}
		return answer{OK: true}
	case "allocate":
		return s.allocate(ctx, m)
	default:
		return answer{Error: fmt.Sprintf("unknown op %q: expected slices, classes or allocate", m.Op)}
	}
}

func main() {
	s := &state{
		slices:  map[string]*resourceapi.ResourceSlice{},
		classes: &classLister{classes: map[string]*resourceapi.DeviceClass{}},
		cache:   cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true}),
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 256<<20)
	out := json.NewEncoder(os.Stdout)
	ctx := context.Background()
	for in.Scan() {
		var m message
		var a answer
		if err := json.Unmarshal(in.Bytes(), &m); err != nil {
			a = answer{Error: fmt.Sprintf("the line is not a message: %v", err)}
		} else {
			a = s.handle(ctx, &m)
		}
		if err := out.Encode(a); err != nil {
			fmt.Fprintf(os.Stderr, "devalloc: cannot write the answer: %v\n", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "devalloc: cannot read stdin: %v\n", err)
		os.Exit(1)
	}
}
