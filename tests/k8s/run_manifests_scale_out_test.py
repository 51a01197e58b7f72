"""The manifests' scale-out and flag-edit proofs, on run_manifests_test's
harness (manifest_run.py): (1) decode scales 1 -> 3 under one long-lived
client whose channel goes through an emulated ClusterIP (each TCP connection
to one ready pod at random, for its life), decode's --max_connection_age
shortened to 2 s: the new pods serve a share of its requests, none fails;
(2) a flag edit (engine.flags) applied under 8 conversations: the new render
changes decode's and prefill's pod templates (not the cachestore's), their
rollouts bring pods on the new flag, none fails."""

import os
import threading
import time
import unittest

import manifests
from hybridserve_client import Client, FinishReason, encode_bytes
from manifest_run import (
    CACHESTORE,
    CONVERSATIONS,
    DECODE,
    DECODE_CONNECTION_AGE_S,
    EDITED_PAGES_LESS,
    MAX_TOKENS,
    OVERLAY,
    PREFILL,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    ClusterIp,
    Conversations,
    metric_sum,
    ManifestRunCase,
    reexec_in_namespaces,
)


class RunManifestsScaleOutTest(ManifestRunCase):

    def test_decode_scale_out_reaches_a_long_lived_client(self):
        # One client, one channel to the decode Service (a ClusterIP: each
        # connection stays on one pod), sending requests one after another
        # throughout. Decode 1 -> 3: the connection age (--max_connection_age,
        # DECODE_CONNECTION_AGE_S here in place of the manifests' 5 min) sends
        # it a GOAWAY, it reconnects, and the new pods serve a share of its
        # requests; none fails.
        def short_age(objs):
            manifests.container(objs, "decode")["args"].append(f"--max_connection_age={DECODE_CONNECTION_AGE_S}s")

        self._start(OVERLAY, edit=short_age)
        self._with_logs_on_failure(self._scale_out_scenario)

    def _scale_out_scenario(self):
        deployments = self.cluster.deployments
        deployments[CACHESTORE].scale(1, READY_TIMEOUT_S)
        deployments[PREFILL].scale(1, READY_TIMEOUT_S)
        deployments[DECODE].scale(1, READY_TIMEOUT_S)
        vip = ClusterIp(self.cluster, DECODE, "grpc")
        failed = []
        stopping = threading.Event()

        def finished(pod):
            return metric_sum(pod.metrics(), "hybridserve_request_success_total")

        def client():
            prompt = encode_bytes("one long-lived client, request ", add_bos=True)
            with Client(vip.target, timeout=REQUEST_TIMEOUT_S) as c:
                n = 0
                while not stopping.is_set():
                    n += 1
                    try:
                        result = c.generate(prompt + encode_bytes(str(n)), max_tokens=MAX_TOKENS, temperature=0.0,
                                            ignore_eos=True)
                        if result.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
                            failed.append(f"request {n}: {result.finish_reason} {result.error_message}")
                    except Exception as e:  # pylint: disable=broad-except
                        failed.append(f"request {n}: {e!r}")

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        try:
            self._scale_out_under(vip, failed, finished)
        finally:
            stopping.set()
            thread.join(REQUEST_TIMEOUT_S)
            vip.close()

    def _scale_out_under(self, vip, failed, finished):
        deployments = self.cluster.deployments
        first = deployments[DECODE].pods[0]
        self.cluster.wait(lambda: finished(first) > 0 or failed, REQUEST_TIMEOUT_S, "the client's first requests")
        deployments[DECODE].scale(3, READY_TIMEOUT_S)
        added = [p for p in deployments[DECODE].pods if p is not first]
        began = time.monotonic()
        # Each reconnection picks one of 3 pods: a new pod missed by 30 in a
        # row has odds (2/3)^30 < 1e-5; one comes each connection age.
        bound_s = 30 * DECODE_CONNECTION_AGE_S + REQUEST_TIMEOUT_S
        self.cluster.wait(lambda: failed or all(finished(p) > 0 for p in added), bound_s,
                          "the new decode pods serve the long-lived client")
        took = time.monotonic() - began
        served = {p.name: finished(p) for p in deployments[DECODE].pods}
        print(f"decode 1 -> 3 under one long-lived client (--max_connection_age={DECODE_CONNECTION_AGE_S}s): "
              f"requests finished by pod {served}, the new pods' first after {took:.1f} s; "
              f"its connections went to {vip.connections}")
        self.assertEqual(failed, [])
        self.assertEqual(self.cluster.failures, [])
        self.assertTrue(all(served[p.name] > 0 for p in added), served)

    def test_a_flag_edit_rolls_the_workers(self):
        # An operator edits a flag (engine.flags: --max_pages) and applies the
        # new render under 8 conversations: the workers' ConfigMap gets a new
        # name, the render changes decode's and prefill's pod templates and
        # not the cachestore's; their rollouts bring pods that run the new
        # flag (decode's hybridserve_kv_pages_total), with no failed request.
        self._start(OVERLAY)
        self._with_logs_on_failure(self._flag_edit_scenario)

    def _flag_edit_scenario(self):
        deployments = self.cluster.deployments
        for name in (CACHESTORE, PREFILL, DECODE):
            deployments[name].scale(1, READY_TIMEOUT_S)
        pages = int(manifests.flags(self.objs, "decode")["max_pages"])
        old_decode = deployments[DECODE].pods[0]
        self.assertEqual(metric_sum(old_decode.metrics(), "hybridserve_kv_pages_total"), pages)

        def edit(root):
            with open(os.path.join(root, "overlays", OVERLAY, "engine.flags"), "a", encoding="utf-8") as f:
                f.write(f"--max_pages={pages - EDITED_PAGES_LESS}\n")

        edited = manifests.render(OVERLAY, edit=edit)
        clients = Conversations(self.cluster)
        clients.start(CONVERSATIONS)
        clients.wait_for_turns(CONVERSATIONS, REQUEST_TIMEOUT_S, "the conversations before the edit")
        changed = self.cluster.apply(edited)
        self.assertEqual(sorted(changed), sorted([DECODE, PREFILL]))
        terminations = []
        deployments[PREFILL].rollout(3 * READY_TIMEOUT_S, terminations)
        deployments[DECODE].rollout(READY_TIMEOUT_S, terminations)
        for t in terminations:
            t.join()
        clients.wait_for_turns(CONVERSATIONS, REQUEST_TIMEOUT_S, "the conversations after the rollouts")
        clients.stop()
        new_decode = deployments[DECODE].pods[0]
        new_pages = metric_sum(new_decode.metrics(), "hybridserve_kv_pages_total")
        print(f"flag edit (--max_pages {pages} -> {pages - EDITED_PAGES_LESS}) applied: rolled {changed}; "
              f"{old_decode.name} had {pages} pages, {new_decode.name} has {new_pages:.0f}; requests sent "
              f"{clients.sent}, failed {len(clients.failed)}")
        self.assertEqual(clients.failed, [])
        self.assertEqual(self.cluster.failures, [])
        self.assertNotIn(old_decode, deployments[DECODE].pods)
        self.assertEqual(new_pages, pages - EDITED_PAGES_LESS)


if __name__ == "__main__":
    reexec_in_namespaces()
    unittest.main()
