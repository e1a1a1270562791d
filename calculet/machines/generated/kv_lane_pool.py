"""The generated functions of KvLanePool's reduced reserve guard, budget measures and one-lane
invariants — do not edit: regenerate with `python -m calculet.specgen`.

Printed by calculet.runtime.scheduling.kv_guard (issues #17, #20) from the z3 terms of the guard and the
invariants declared in
calculet.machines.kv_pool.KvLanePool
and of kv_guard.MEASURES; `python -m calculet.specgen --check` fails when this file is not what they
produce. The KV lane manager and its monitor import it instead of generating it at start.
"""

DECLARATION = 'calculet.machines.kv_pool.KvLanePool'
SHAPE = '1139eebe513d40b4'

def reserve_guard(l0, l1, used, budgets, seq, gen, tokens):  # KvLanePool.reserve on the reduced view (kv_guard)
    max_kv_tokens = budgets[0] - used[0] + (l0.reserved_len) + (l1.reserved_len)
    max_sequences = budgets[1] - used[1] + ((0 if (l0.state == 'free') else 1)) + ((0 if (l1.state == 'free') else 1))
    return (((0 if (l1.state == 'free') else 1) <= (-1 + max_sequences)) and ((l1.reserved_len + tokens) <= max_kv_tokens) and (not ((l1.generation == gen) and (l1.seq_id == seq) and (not (l1.state == 'free')))))


def measures(l0):  # KvLanePool: each budget's use by one lane (kv_guard.MEASURES)
    return (l0.reserved_len, (0 if (l0.state == 'free') else 1), )


def moves(totals, before, l0):  # KvLanePool: the budget totals follow one lane (kv_guard.MEASURES)
    totals[0] += (l0.reserved_len) - before[0]
    totals[1] += ((0 if (l0.state == 'free') else 1)) - before[1]


def one_lane_broken(l0, g, budgets):  # KvLanePool's invariants on a one-lane view (kv_guard)
    max_kv_tokens = budgets['max_kv_tokens']
    max_sequences = budgets['max_sequences']
    broken = []
    if not True:
        broken.append('unique_owner_per_generation')
    if not (l0.reserved_len <= max_kv_tokens):
        broken.append('kv_tokens_within_budget')
    if not ((0 <= max_sequences) if (l0.state == 'free') else (1 <= max_sequences)):
        broken.append('sequences_within_budget')
    return broken
