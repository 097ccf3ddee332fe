"""orbite-info against the sysfs fixtures (tests/data/sysfs), and with --device on this host's
verbs devices (the soft-RoCE VM's four rxe NICs): the inventory, GPU tiers, filters from RDMA
settings, a priority matrix, rankings, both output forms and the usage errors.

    check_orbite_info.py ORBITE_INFO FIXTURES_DIR [--device]
"""
import json
import os
import subprocess
import sys


def run(tool, *args, expect=0):
    p = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, ORBITE_LOG="error"))
    if p.returncode != expect:
        raise AssertionError("%s %s: exit %d, wanted %d\n%s%s" % (tool, " ".join(args), p.returncode, expect,
                                                                 p.stdout, p.stderr))
    return p


def info(tool, *args):
    return json.loads(run(tool, "--json", *args).stdout)


def ranking(doc):
    return [r["nic"] for r in doc["ranking"]]


def fixtures(tool, root):
    dgx = os.path.join(root, "dgx8")
    doc = info(tool, "--sysfs", dgx, "--location", "cuda:3")
    assert doc["inventory_from"] == dgx
    assert [n["name"] for n in doc["nics"]] == ["mlx5_%d" % i for i in range(8)]
    assert len(doc["gpus"]) == 8 and all(g["dmabuf"] is None for g in doc["gpus"])
    assert doc["policy"] is None and "not asked" in doc["policy_why"]
    assert doc["matrix"] is None
    # cuda:3 sits under the bridge of mlx5_2 and mlx5_3, on the node of mlx5_0..3.
    g3 = doc["gpus"][3]
    assert g3["nic_tiers"]["mlx5_2"] == 0 and g3["nic_tiers"]["mlx5_3"] == 0 and g3["nic_tiers"]["mlx5_0"] == 1
    assert g3["nic_tiers"]["mlx5_7"] == 2
    # mlx5_5's port is down: the selector would not use it now.
    assert ranking(doc) == ["mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1", "mlx5_4", "mlx5_6", "mlx5_7"]
    port = doc["nics"][5]["ports"][0]
    assert port["state"] == "DOWN" and port["link_mbps"] == 10000
    # Filters from RDMA settings, and a priority matrix.
    two = os.path.join(root, "two-socket")
    doc = info(tool, "--sysfs", two, "--location", "cpu:0", "--rdma", '{"rdma_blacklist":["mlx5_0"]}')
    assert [n["eligible"] for n in doc["nics"]][0] is False
    assert "mlx5_0" not in ranking(doc) and ranking(doc)
    names = [n["name"] for n in info(tool, "--sysfs", two)["nics"]]
    assert len(names) >= 2
    # The matrix puts the last NIC first and the first second for cpu:0, leaving out the rest.
    matrix = json.dumps({"cpu:0": [[names[-1]], [names[0]]]})
    doc = info(tool, "--sysfs", two, "--location", "cpu:0", "--rdma", json.dumps({"priority_matrix": matrix}))
    assert doc["matrix"] == "priority_matrix"
    assert ranking(doc) == [names[-1], names[0]], ranking(doc)
    # Text form: every section.
    text = run(tool, "--sysfs", dgx, "--location", "*").stdout
    for section in ("Inventory: from", "NICs (8):", "GPUs (8):", "NIC priority matrix:", "Policy:",
                    "GPUDirect RDMA:", "NIC ranking for *:"):
        assert section in text, section
    # Usage and host errors.
    run(tool, "--nonsense", expect=2)
    run(tool, "extra", expect=2)
    run(tool, "--location", "gpu:1", "--sysfs", dgx, expect=2)
    run(tool, "--sysfs", dgx, "--rdma", "{not json", expect=2)
    run(tool, "--sysfs", dgx, "--rdma", '{"no_such_key": 1}', expect=2)
    run(tool, "--sysfs", "/nonexistent/sysfs", expect=1)
    assert "not a sysfs tree" in run(tool, "--sysfs", os.path.join(dgx, "class"), expect=1).stderr
    assert "'--nonsense' is not an option" in run(tool, "--nonsense", expect=2).stderr
    assert "'--sysfs' is missing its value" in run(tool, "--sysfs", expect=2).stderr
    assert "usage:" in run(tool, "--help").stdout


def device(tool):
    if not os.path.isdir("/sys/class/infiniband") or not os.listdir("/sys/class/infiniband"):
        if os.environ.get("ORBITE_VM"):
            raise AssertionError("no verbs device inside the test VM")
        print("SKIP: no verbs device")
        sys.exit(77)
    doc = info(tool, "--no-helper", "--location", "*")
    names = sorted(os.listdir("/sys/class/infiniband"))
    assert sorted(n["name"] for n in doc["nics"]) == names
    for n in doc["nics"]:
        assert n["usable"] and n["ports"], n
        port = n["ports"][0]
        assert port["state"] == "ACTIVE" and port["link_layer"] == "Ethernet"
        assert any(g["type"] == "RoCEv2" for g in port["gids"]), port
    assert sorted(ranking(doc)) == names
    assert doc["gpudirect"]["verbs_dmabuf"] is not None


def main():
    tool, root = sys.argv[1], sys.argv[2]
    if "--device" in sys.argv[3:]:
        device(tool)
    else:
        fixtures(tool, root)
    print("orbite-info: OK")


if __name__ == "__main__":
    main()
