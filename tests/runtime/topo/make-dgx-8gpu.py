#!/usr/bin/env python3
"""Writes dgx-8gpu.xml: a DGX H100-like node in hwloc's v2 XML (2 packages of 56 cores,
2 hyperthreads each numbered the Intel way (core c: PUs c and c+112), one NUMA node per
package, 8 H100 SXM GPUs at the DGX H100's PCI bus ids, 4 under each package). Written by
hand: no real export of such a node is public in hwloc's tests. Check with
`lstopo-no-graphics --input dgx-8gpu.xml`."""
import sys

CORES, PACK, SMT = 56, 2, 2
NPU = CORES * PACK * SMT
GPUS = [["1b", "43", "52", "61"], ["9d", "c3", "d1", "df"]]
gp = [0]


def gpi():
    gp[0] += 1
    return gp[0]


def bitmap(bits):
    words = [0] * ((NPU + 31) // 32)
    for b in bits:
        words[b // 32] |= 1 << (b % 32)
    return ",".join("0x%08x" % w for w in reversed(words))


def sets(cpus, nodes):
    c, n = bitmap(cpus), bitmap(nodes)
    return 'cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s"' % (c, c, n, n)


def pus_of(p):
    first = list(range(p * CORES, (p + 1) * CORES))
    return first + [c + CORES * PACK for c in first]


out = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
       '<topology version="2.0">']
allc = list(range(NPU))
out.append('  <object type="Machine" os_index="0" %s allowed_cpuset="%s" allowed_nodeset="%s" '
           'gp_index="%d">' % (sets(allc, [0, 1]), bitmap(allc), bitmap([0, 1]), gpi()))
out.append('    <info name="DMIProductName" value="DGX H100 (hand-written layout)"/>')
out.append('    <info name="Backend" value="Linux"/>')
out.append('    <info name="OSName" value="Linux"/>')
out.append('    <info name="Architecture" value="x86_64"/>')
cuda = 0
for p in range(PACK):
    pc = pus_of(p)
    out.append('    <object type="Package" os_index="%d" %s gp_index="%d">' % (p, sets(pc, [p]), gpi()))
    out.append('      <info name="CPUVendor" value="GenuineIntel"/>')
    out.append('      <info name="CPUModel" value="Intel(R) Xeon(R) Platinum 8480C"/>')
    out.append('      <object type="NUMANode" os_index="%d" %s gp_index="%d" local_memory="1082331758592"/>'
               % (p, sets(pc, [p]), gpi()))
    out.append('      <object type="L3Cache" %s gp_index="%d" cache_size="110100480" depth="3" '
               'cache_linesize="64" cache_associativity="15" cache_type="0">' % (sets(pc, [p]), gpi()))
    for c in range(p * CORES, (p + 1) * CORES):
        th = [c, c + CORES * PACK]
        out.append('        <object type="Core" os_index="%d" %s gp_index="%d">'
                   % (c - p * CORES, sets(th, [p]), gpi()))
        for t in th:
            out.append('          <object type="PU" os_index="%d" %s gp_index="%d"/>' % (t, sets([t], [p]), gpi()))
        out.append('        </object>')
    out.append('      </object>')
    for bus in GPUS[p]:
        out.append('      <object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" '
                   'bridge_pci="0000:[%s-%s]">' % (gpi(), bus, bus))
        out.append('        <object type="PCIDev" gp_index="%d" pci_busid="0000:%s:00.0" '
                   'pci_type="0302 [10de:2330] [10de:16c1] a1 00" pci_link_speed="31.507692">'
                   % (gpi(), bus))
        out.append('          <object type="OSDev" gp_index="%d" name="cuda%d" subtype="CUDA" '
                   'osdev_type="5"/>' % (gpi(), cuda))
        out.append('        </object>')
        out.append('      </object>')
        cuda += 1
    out.append('    </object>')
out.append('  </object>')
out.append('</topology>')
open(sys.argv[1] if len(sys.argv) > 1 else "dgx-8gpu.xml", "w").write("\n".join(out) + "\n")
