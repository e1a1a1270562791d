"""The KV lane pool (§9.2, §5.1, §7.1): N KvSequenceMachine lanes and the pool's own rules."""

from __future__ import annotations

from calculet.logic.expr import And, If, Implies, Not
from calculet.logic.types import Int
from calculet.machines.kv_sequence import KvSequenceMachine
from calculet.machines.pool import Pool, PoolInvariant, PoolOp


def _held(lane):
    return Not(lane.at("free"))


def _reserved_total(pool, lanes):
    return sum((pool.lanes[j].reserved_len for j in lanes), 0)


def _held_count(pool, lanes):
    return sum((If(_held(pool.lanes[j]), 1, 0) for j in lanes), 0)


class KvLanePool(Pool):
    """The rules the runtime's KvLaneManager adds on top of each lane's own lifecycle.

    * ``reserve`` may not give a (seq_id, generation) that another held lane already owns
      (§9.2: one active hardware lane per seq_id within a generation), and must stay within the
      admission budget: reserved tokens ≤ ``max_kv_tokens``, held lanes ≤ ``max_sequences``
      (§5.1; the service tracks tokens itself, canAllocate is only a hint).
    * The position a step binds for the lane is its committed_len (§7.1, §9.2): the lane has no
      in-flight state of its own (#20), so that is the joint systems' — nothing but the lane's own
      job, once it answered, commits it while its step is open (``JobLaneSystem`` step property
      ``lane_commits_only_after_its_job_answered``), and a decoding request's position is its
      lane's committed_len (``RequestLaneSystem.decode_position_is_committed_len``).
    """

    spec = "§9.2, §5.1, §7.1"
    instance = KvSequenceMachine
    params = {"max_kv_tokens": Int(ge=1), "max_sequences": Int(ge=1)}

    ops = [
        PoolOp("reserve", doc="unique owner per generation; KV-token and sequence budgets",
               guard=lambda pool, i, seq, gen, tokens: And(
                   *[Not(And(_held(pool.lanes[j]), pool.lanes[j].seq_id == seq,
                             pool.lanes[j].generation == gen)) for j in pool.others(i)],
                   _reserved_total(pool, pool.others(i)) + tokens <= pool.max_kv_tokens,
                   _held_count(pool, pool.others(i)) + 1 <= pool.max_sequences)),
    ]

    invariants = [
        PoolInvariant("R9.2.1", "unique_owner_per_generation", rejects=({"params": {"max_kv_tokens": 8, "max_sequences": 2}, "lanes": [{"state": "reserved", "seq_id": 1, "generation": 1, "reserved_len": 1}, {"state": "reserved", "seq_id": 1, "generation": 1, "reserved_len": 1}]},),
                      doc="no two held lanes share a (seq_id, generation)",
                      predicate=lambda pool: And(*[
                          Implies(And(_held(pool.lanes[a]), _held(pool.lanes[b])),
                                  Not(And(pool.lanes[a].seq_id == pool.lanes[b].seq_id,
                                          pool.lanes[a].generation == pool.lanes[b].generation)))
                          for a in range(len(pool.lanes)) for b in range(a + 1, len(pool.lanes))])),
        PoolInvariant("R5.1.2", "kv_tokens_within_budget", rejects=({"params": {"max_kv_tokens": 2, "max_sequences": 2}, "lanes": [{"state": "reserved", "seq_id": 1, "generation": 1, "reserved_len": 3}]},),
                      doc="reserved tokens of all lanes never exceed max_kv_tokens",
                      predicate=lambda pool: _reserved_total(pool, range(len(pool.lanes))) <= pool.max_kv_tokens),
        PoolInvariant("R5.1.2", "sequences_within_budget", rejects=({"params": {"max_kv_tokens": 8, "max_sequences": 1}, "lanes": [{"state": "reserved", "seq_id": 1, "generation": 1, "reserved_len": 1}, {"state": "reserved", "seq_id": 2, "generation": 1, "reserved_len": 1}]},),
                      doc="held lanes never exceed max_sequences",
                      predicate=lambda pool: _held_count(pool, range(len(pool.lanes))) <= pool.max_sequences),
    ]

    related = [
        ("KvSequenceMachine", "free_only_after_confirmed_release",
         "every lane obeys it, so no lane of the pool is reused before the runtime confirmed its release (R9.2.2)"),
        ("KvSequenceMachine", "unknown_is_quarantined",
         "every lane obeys it, so an Unknown lane is never assigned in the pool (R9.2.6)"),
        ("RequestMachine", "terminal_closed_once",
         "each request's stream closes once whatever the other requests do: at most once for all M (R4.6, R4.7)"),
        ("DeviceJobMachine", "delivered_only_when_completed", "each job delivers its results at most once (R4.7)"),
        ("GenerationJobSystem", "job_on_the_device_keeps_its_generations_buffers",
         "no generation frees buffers while a job of it is in flight (R12.10)"),
    ]
