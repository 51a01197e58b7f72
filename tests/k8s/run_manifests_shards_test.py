"""The cachestore's StatefulSet of shards as the cpu overlay declares it, run
by local_cluster.py (run_manifests_test's harness, manifest_run.py) alone:
every shard Ready at once (Parallel), the headless Service's name resolving
to every ready shard and each pod's own name to its pod, each shard named by
its pod (--shard_name=$(POD_NAME)), a disk each (the claim's directory), and
a rolling update from the highest ordinal down, one shard at a time, each
replacement under its old name finding its disk as it was left.

The shards run the built cachestore with every flag the cpu overlay gives
it (the disk tier's and --shard_name included); run_manifests_test runs the
whole stack."""

import os
import socket
import unittest

import local_cluster
import manifests
from manifest_run import CACHESTORE, OVERLAY, READY_TIMEOUT_S, ManifestRunCase, reexec_in_namespaces

SHARDS_SERVICE = manifests.SERVICES["cachestore"]


def addresses(name):
    return sorted({a[4][0] for a in socket.getaddrinfo(name, 50051, proto=socket.IPPROTO_TCP)})


class RunManifestsShardsTest(ManifestRunCase):

    def test_shards_start_together_keep_their_names_and_disks_and_roll_one_at_a_time(self):
        self._start(OVERLAY)
        self._with_logs_on_failure(self._scenario)

    def _scenario(self):
        shards = self.cluster.deployments[CACHESTORE]
        replicas = manifests.workload(self.objs, "cachestore")["spec"]["replicas"]
        self.assertIsInstance(shards, local_cluster.StatefulSet)
        self.assertGreaterEqual(replicas, 2)
        shards.scale(replicas, READY_TIMEOUT_S)
        names = [f"{CACHESTORE}-{i}" for i in range(replicas)]
        self.assertEqual([p.pod_name for p in shards.pods], names)
        # Parallel: every shard's process started before any turned ready.
        first_ready = min(p.ready_since for p in shards.pods)
        self.assertTrue(all(p.started_at < first_ready for p in shards.pods))
        # The headless Service: every ready shard; each pod its own name.
        self.assertEqual(addresses(SHARDS_SERVICE), sorted(p.ip for p in shards.pods))
        for pod in shards.pods:
            self.assertEqual(addresses(f"{pod.pod_name}.{SHARDS_SERVICE}"), [pod.ip])
            self.assertEqual(local_cluster.expand("$(POD_NAME)", pod.env), pod.pod_name)
        # A disk each, kept for the pod's name: what a shard wrote there.
        disk_dir = manifests.flags(self.objs, "cachestore").get("disk_dir", manifests.DISK_DIR)
        disks = {p.pod_name: p.mounts[disk_dir] for p in shards.pods}
        self.assertEqual(len(set(disks.values())), replicas)
        for name, disk in disks.items():
            with open(os.path.join(disk, "written-by"), "w", encoding="utf-8") as f:
                f.write(name)

        old = list(shards.pods)
        terminations = []
        shards.rollout(replicas * READY_TIMEOUT_S, terminations)
        for t in terminations:
            t.join()
        self.assertEqual([p.pod_name for p in shards.pods], names)
        self.assertTrue(all(p.deleted and p not in shards.pods for p in old))
        # The highest ordinal first, one at a time: each old shard was
        # deleted only once the one above it had its replacement ready.
        replaced = sorted(old, key=lambda p: p.deleted_at)
        self.assertEqual([p.pod_name for p in replaced], list(reversed(names)))
        for above, below in zip(replaced, replaced[1:]):
            new_above = next(p for p in shards.pods if p.pod_name == above.pod_name)
            self.assertLessEqual(new_above.ready_since, below.deleted_at)
        for pod in shards.pods:
            self.assertEqual(pod.mounts[disk_dir], disks[pod.pod_name])
            with open(os.path.join(pod.mounts[disk_dir], "written-by"), encoding="utf-8") as f:
                self.assertEqual(f.read(), pod.pod_name)
        self.assertEqual(addresses(SHARDS_SERVICE), sorted(p.ip for p in shards.pods))
        self.assertEqual(self.cluster.failures, [])
        print(f"{replicas} shards ready; rolled {[p.pod_name for p in replaced]} at "
              f"{[round(p.deleted_at - replaced[0].deleted_at, 1) for p in replaced]} s, "
              f"SIGTERM to exit {[round(p.sigterm_to_exit_s, 2) for p in replaced]} s")


if __name__ == "__main__":
    reexec_in_namespaces()
    unittest.main()
