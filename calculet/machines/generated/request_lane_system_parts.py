"""The generated checks of RequestLaneSystem's invariants on a small part — do not edit: regenerate with
`python -m calculet.specgen`.

Printed from the z3 terms of the invariants declared in calculet.machines.request_lanes.RequestLaneSystem by
calculet.runtime.scheduling.joint_codegen (issue #20); `python -m calculet.specgen --check` fails when this
file is not what the declaration produces. The joint monitor imports it instead of generating it at start.
"""

DECLARATION = 'calculet.machines.request_lanes.RequestLaneSystem'
SHAPE = '1a003e3f1186c3e9'

def part_broken_0x0(r0, l0, b0, s0):  # RequestLaneSystem on 0 request(s) x 0 lane(s)
    broken = []
    if not True:
        broken.append('holding_request_owns_one_lane')
    if not True:
        broken.append('lane_bound_at_most_once')
    if not True:
        broken.append('decode_position_is_committed_len')
    if not True:
        broken.append('ended_request_holds_no_lane')
    if not True:
        broken.append('unknown_lane_unbound')
    if not True:
        broken.append('free_lane_unbound')
    if not True:
        broken.append('bound_exactly_while_holding')
    if not True:
        broken.append('unadmitted_request_named_by_no_lane')
    if not True:
        broken.append('request_and_lane_phases_agree')
    return broken


def part_broken_0x1(r0, l0, b0, s0):  # RequestLaneSystem on 0 request(s) x 1 lane(s)
    broken = []
    if not True:
        broken.append('holding_request_owns_one_lane')
    if not True:
        broken.append('lane_bound_at_most_once')
    if not True:
        broken.append('decode_position_is_committed_len')
    if not True:
        broken.append('ended_request_holds_no_lane')
    if not True:
        broken.append('unknown_lane_unbound')
    if not True:
        broken.append('free_lane_unbound')
    if not True:
        broken.append('bound_exactly_while_holding')
    if not True:
        broken.append('unadmitted_request_named_by_no_lane')
    if not True:
        broken.append('request_and_lane_phases_agree')
    return broken


def part_broken_1x0(r0, l0, b0, s0):  # RequestLaneSystem on 1 request(s) x 0 lane(s)
    broken = []
    if not ((not ((r0.state == 'decode_ready') or (r0.state == 'decode_running') or (r0.state == 'prefill_ready') or (r0.state == 'prefill_running'))) or (not (b0 == -1))):
        broken.append('holding_request_owns_one_lane')
    if not True:
        broken.append('lane_bound_at_most_once')
    if not True:
        broken.append('decode_position_is_committed_len')
    if not ((b0 == -1) or (not ((r0.state == 'cancelled') or (r0.state == 'completed') or (r0.state == 'failed') or (r0.state == 'finishing')))):
        broken.append('ended_request_holds_no_lane')
    if not True:
        broken.append('unknown_lane_unbound')
    if not True:
        broken.append('free_lane_unbound')
    if not (not ((b0 == -1) == ((r0.state == 'decode_ready') or (r0.state == 'decode_running') or (r0.state == 'prefill_ready') or (r0.state == 'prefill_running')))):
        broken.append('bound_exactly_while_holding')
    if not True:
        broken.append('unadmitted_request_named_by_no_lane')
    if not True:
        broken.append('request_and_lane_phases_agree')
    return broken


def part_broken_1x1(r0, l0, b0, s0):  # RequestLaneSystem on 1 request(s) x 1 lane(s)
    broken = []
    if not (((((l0.generation == r0.generation) and (l0.seq_id == s0) and (not (l0.state == 'free'))) or (not (b0 == 0))) and ((b0 == 0) or (not ((l0.generation == r0.generation) and (l0.seq_id == s0) and (not (l0.state == 'free'))))) and (not (b0 == -1))) or (not ((r0.state == 'decode_ready') or (r0.state == 'decode_running') or (r0.state == 'prefill_ready') or (r0.state == 'prefill_running')))):
        broken.append('holding_request_owns_one_lane')
    if not True:
        broken.append('lane_bound_at_most_once')
    if not ((not (((r0.state == 'completed') or (r0.state == 'decode_ready') or (r0.state == 'decode_running') or (r0.state == 'finishing')) and ((r0.state == 'decode_ready') or (r0.state == 'decode_running') or (r0.state == 'prefill_ready') or (r0.state == 'prefill_running')) and (b0 == 0))) or (r0.kv_length == l0.committed_len)):
        broken.append('decode_position_is_committed_len')
    if not (((b0 == -1) and (not (((l0.state == 'active') or (l0.state == 'reserved')) and (l0.generation == r0.generation) and (l0.seq_id == s0)))) or (not ((r0.state == 'cancelled') or (r0.state == 'completed') or (r0.state == 'failed') or (r0.state == 'finishing')))):
        broken.append('ended_request_holds_no_lane')
    if not ((not (b0 == 0)) or (not (l0.state == 'unknown'))):
        broken.append('unknown_lane_unbound')
    if not ((not (b0 == 0)) or (not (l0.state == 'free'))):
        broken.append('free_lane_unbound')
    if not (not ((b0 == -1) == ((r0.state == 'decode_ready') or (r0.state == 'decode_running') or (r0.state == 'prefill_ready') or (r0.state == 'prefill_running')))):
        broken.append('bound_exactly_while_holding')
    if not ((not ((l0.seq_id == s0) and (not (l0.state == 'free')))) or (not ((r0.state == 'new') or (r0.state == 'waiting_admission') or (r0.state == 'waiting_model')))):
        broken.append('unadmitted_request_named_by_no_lane')
    if not ((((l0.state == 'active') or (l0.state == 'reserved') or (not (r0.state == 'prefill_running'))) and ((l0.state == 'active') or (not (r0.state == 'decode_ready'))) and ((l0.state == 'active') or (not (r0.state == 'decode_running'))) and ((l0.state == 'reserved') or (not (r0.state == 'prefill_ready')))) or (not (b0 == 0))):
        broken.append('request_and_lane_phases_agree')
    return broken


CHECKS = {(0, 0): part_broken_0x0, (0, 1): part_broken_0x1, (1, 0): part_broken_1x0, (1, 1): part_broken_1x1}
