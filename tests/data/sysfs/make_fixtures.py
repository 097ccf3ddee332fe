#!/usr/bin/env python3
"""Regenerate the sysfs fixture trees used by the topology tests.

Each tree mirrors the layout of a real /sys: device directories under devices/ (one directory
per PCI function, nested below its bridges), class/infiniband/<nic> and bus/pci/devices/<bdf>
as relative symlinks into devices/, an infiniband/<nic>/device link back to the PCI function,
and devices/system/node/node<N>/distance rows.

  two-socket  2 NUMA nodes, one ConnectX RoCE NIC per socket (RoCE v1 + v2 GIDs, 1 port each),
              a BMC VGA adapter and an Intel Ethernet NIC that are neither GPUs nor RDMA devices.
  dgx8        2 sockets, 4 PCIe switches each holding 2 GPUs and 2 InfiniBand NICs (8 + 8);
              socket 0's two switches hang below one shared top-level switch, socket 1's sit on
              separate root ports; NVSwitch bridges (NVIDIA, class 0x0680) are not GPUs;
              mlx5_5's port is DOWN.
  no-numa     a virtual machine: 1 RoCE NIC and 1 GPU, no numa_node files, no node directory.

Usage: make_fixtures.py [output-dir]   (default: the directory holding this script)
"""
import os
import shutil
import sys

FIXTURES = ("two-socket", "dgx8", "no-numa")


class Tree:
    def __init__(self, root):
        self.root = root
        self.numa = True

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def symlink(self, rel, target):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(target, path)

    def pci(self, chain, vendor, device, pci_class, numa):
        """A PCI function at devices/<chain...>; chain[0] is the root complex (pciDDDD:BB)."""
        rel = "devices/" + "/".join(chain)
        bdf = chain[-1]
        self.write(rel + "/vendor", "0x%04x\n" % vendor)
        self.write(rel + "/device", "0x%04x\n" % device)
        self.write(rel + "/class", "0x%06x\n" % pci_class)
        if self.numa:
            self.write(rel + "/numa_node", "%d\n" % numa)
        self.symlink("bus/pci/devices/" + bdf, "../../../" + rel)
        return rel

    def bridges(self, chain, root_vendor, numa):
        """Every hop of `chain` after the root complex as a PCI-to-PCI bridge (once each): the
        CPU's root port from `root_vendor`, PCIe switch ports below it from Broadcom/PLX."""
        for depth in range(2, len(chain) + 1):
            if os.path.lexists(os.path.join(self.root, "devices", *chain[:depth])):
                continue
            if depth == 2:
                self.pci(chain[:depth], root_vendor, 0x1483, 0x060400, numa)
            else:
                self.pci(chain[:depth], 0x10B5, 0xC010, 0x060400, numa)

    def nic(self, name, chain, numa, guid, link_layer, rate, state, gids, device_id, netdev=None):
        """An RDMA device below the PCI function chain[-1] with one port."""
        fn = self.pci(chain, 0x15B3, device_id, 0x020700 if link_layer == "InfiniBand" else 0x020000, numa)
        dev = fn + "/infiniband/" + name
        self.symlink("class/infiniband/" + name, "../../" + dev)
        self.symlink(dev + "/device", "../../../" + chain[-1])
        g = ["%04x" % ((guid >> s) & 0xFFFF) for s in (48, 32, 16, 0)]
        self.write(dev + "/node_guid", ":".join(g) + "\n")
        self.write(dev + "/sys_image_guid", ":".join(g) + "\n")
        self.write(dev + "/node_type", "1: CA\n")
        self.write(dev + "/hca_type", "MT4123\n")
        self.write(dev + "/fw_ver", "20.39.1002\n")
        self.write(dev + "/node_desc", "%s %s\n" % (os.path.basename(self.root), name))
        port = dev + "/ports/1"
        self.write(port + "/state", state + "\n")
        self.write(port + "/phys_state", ("5: LinkUp" if state == "4: ACTIVE" else "3: Disabled") + "\n")
        self.write(port + "/link_layer", link_layer + "\n")
        self.write(port + "/rate", rate + "\n")
        self.write(port + "/lid", "0x%x\n" % ((guid & 0xFF) if link_layer == "InfiniBand" else 0))
        self.write(port + "/sm_lid", "0x%x\n" % (1 if link_layer == "InfiniBand" else 0))
        for index, (gid, gid_type) in enumerate(gids):
            self.write(port + "/gids/%d" % index, gid + "\n")
            if gid_type is not None:  # the kernel has no type for an unset entry
                self.write(port + "/gid_attrs/types/%d" % index, gid_type + "\n")
                if netdev:
                    self.write(port + "/gid_attrs/ndevs/%d" % index, netdev + "\n")

    def node(self, node_id, distances, cpulist):
        base = "devices/system/node/node%d" % node_id
        self.write(base + "/distance", " ".join(str(d) for d in distances) + "\n")
        self.write(base + "/cpulist", cpulist + "\n")


ZERO_GID = ":".join(["0000"] * 8)


def gid_text(prefix_words, tail_words):
    return ":".join("%04x" % w for w in list(prefix_words) + list(tail_words))


def link_local(guid):
    return gid_text([0xFE80, 0, 0, 0], [(guid >> s) & 0xFFFF for s in (48, 32, 16, 0)])


def ipv4_mapped(a, b, c, d):
    return gid_text([0, 0, 0, 0, 0, 0xFFFF], [(a << 8) | b, (c << 8) | d])


def roce_gids(guid, ip):
    """A RoCE port's table: link-local and one IPv4 address, each as v1 and v2, then unset."""
    ll = link_local(guid ^ 0x0200000000000000)  # EUI-64 from the MAC: universal/local bit flipped
    v4 = ipv4_mapped(*ip)
    table = [(ll, "IB/RoCE v1"), (ll, "RoCE v2"), (v4, "IB/RoCE v1"), (v4, "RoCE v2")]
    return table + [(ZERO_GID, None)] * 4


def ib_gids(guid):
    return [(link_local(guid), "IB/RoCE v1")] + [(ZERO_GID, None)] * 7


def two_socket(t):
    t.bridges(["pci0000:30", "0000:30:02.0"], 0x8086, 0)
    t.nic("mlx5_0", ["pci0000:30", "0000:30:02.0", "0000:31:00.0"], 0, 0x0C42A10300650A10,
          "Ethernet", "100 Gb/sec (4X EDR)", "4: ACTIVE", roce_gids(0x0C42A1FFFE650A10, (192, 168, 10, 11)),
          0x101D, "ens1f0np0")
    t.bridges(["pci0000:b0", "0000:b0:02.0"], 0x8086, 1)
    t.nic("mlx5_1", ["pci0000:b0", "0000:b0:02.0", "0000:b1:00.0"], 1, 0x0C42A10300650B20,
          "Ethernet", "25 Gb/sec (1X EDR)", "4: ACTIVE", roce_gids(0x0C42A1FFFE650B20, (192, 168, 20, 11)),
          0x101D, "ens5f0np0")
    # Neither is a GPU nor an RDMA device: a BMC VGA adapter and an Intel 10GbE NIC.
    t.bridges(["pci0000:00", "0000:00:1c.0"], 0x8086, 0)
    t.pci(["pci0000:00", "0000:00:1c.0", "0000:03:00.0"], 0x102B, 0x0536, 0x030000, 0)
    t.bridges(["pci0000:4a", "0000:4a:02.0"], 0x8086, 0)
    t.pci(["pci0000:4a", "0000:4a:02.0", "0000:4b:00.0"], 0x8086, 0x1572, 0x020000, 0)
    t.node(0, [10, 20], "0-31,64-95")
    t.node(1, [20, 10], "32-63,96-127")
    t.write("devices/system/node/online", "0-1\n")
    t.write("devices/system/node/possible", "0-1\n")
    t.write("devices/system/node/has_cpu", "0-1\n")


def dgx8(t):
    # Leaf switch s: GPUs on its first two downstream ports, NICs on the next two.
    leaves = [
        # (chain to the leaf switch's upstream port, downstream bus, endpoint buses, numa)
        (["pci0000:00", "0000:00:01.1", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"], 0x04,
         [0x05, 0x06, 0x07, 0x08], 0),
        (["pci0000:00", "0000:00:01.1", "0000:01:00.0", "0000:02:01.0", "0000:09:00.0"], 0x0A,
         [0x0B, 0x0C, 0x0D, 0x0E], 0),
        (["pci0000:80", "0000:80:01.1", "0000:81:00.0"], 0x82, [0x83, 0x84, 0x85, 0x86], 1),
        (["pci0000:80", "0000:80:03.1", "0000:87:00.0"], 0x88, [0x89, 0x8A, 0x8B, 0x8C], 1),
    ]
    nic = 0
    for upstream, down_bus, buses, numa in leaves:
        for slot, bus in enumerate(buses):
            down = upstream + ["0000:%02x:%02x.0" % (down_bus, slot)]
            t.bridges(down, 0x1022, numa)
            chain = down + ["0000:%02x:00.0" % bus]
            if slot < 2:
                t.pci(chain, 0x10DE, 0x20B0, 0x030200, numa)  # A100 SXM4: 3D controller
            else:
                guid = 0xB83FD20300A45E10 + nic
                state = "1: DOWN" if nic == 5 else "4: ACTIVE"
                rate = "10 Gb/sec (4X SDR)" if nic == 5 else "200 Gb/sec (4X HDR)"
                t.nic("mlx5_%d" % nic, chain, numa, guid, "InfiniBand", rate, state, ib_gids(guid), 0x101B)
                nic += 1
    # Six NVSwitches (NVIDIA bridge-class functions) and the BMC's VGA adapter.
    t.bridges(["pci0000:c0", "0000:c0:01.1"], 0x1022, 1)
    for i in range(6):
        t.pci(["pci0000:c0", "0000:c0:01.1", "0000:%02x:00.0" % (0xC1 + i)], 0x10DE, 0x1AF1, 0x068000, 1)
    t.bridges(["pci0000:40", "0000:40:07.1"], 0x1022, 0)
    t.pci(["pci0000:40", "0000:40:07.1", "0000:41:00.0"], 0x1A03, 0x2000, 0x030000, 0)
    t.node(0, [10, 32], "0-63,128-191")
    t.node(1, [32, 10], "64-127,192-255")
    t.write("devices/system/node/online", "0-1\n")
    t.write("devices/system/node/possible", "0-1\n")


def no_numa(t):
    t.numa = False  # no numa_node files and no devices/system/node
    t.bridges(["pci0000:00", "0000:00:02.0"], 0x1B36, -1)
    t.nic("mlx5_0", ["pci0000:00", "0000:00:02.0", "0000:01:00.0"], -1, 0x0C42A10300770C30,
          "Ethernet", "25 Gb/sec (1X EDR)", "4: ACTIVE", roce_gids(0x0C42A1FFFE770C30, (10, 0, 0, 5)),
          0x101E, "eth1")
    t.bridges(["pci0000:00", "0000:00:02.1"], 0x1B36, -1)
    t.pci(["pci0000:00", "0000:00:02.1", "0000:02:00.0"], 0x10DE, 0x2330, 0x030200, -1)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, build in zip(FIXTURES, (two_socket, dgx8, no_numa)):
        root = os.path.join(out, name)
        if os.path.lexists(root):
            shutil.rmtree(root)
        os.makedirs(root)
        build(Tree(root))


if __name__ == "__main__":
    main()
