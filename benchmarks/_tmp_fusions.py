"""Print the entry instructions of the consume-first issue-block HLO whose outputs are tuples holding 256 MiB arrays, and their fused computations."""
import glob, re, sys
path = sorted(glob.glob(sys.argv[1] + "/*jit_fused_mincut_consume_first.*after_optimizations.txt"))[-1]
text = open(path).read()
entry = text[text.index("\nENTRY"):]
for line in entry.splitlines():
    if re.search(r"= \(.*bf16\[8,16,1024,1024\]", line) or re.search(r"= \(f32\[8,16,1024\]", line):
        print(line[:600])
        calls = re.search(r"calls=%([\w.\-]+)", line)
        if calls:
            m = re.search(r"\n%" + re.escape(calls.group(1)) + r" .*?\n}\n", text, re.S)
            if m:
                for l in m.group(0).splitlines():
                    print("    " + re.sub(r", metadata=\{[^}]*\}", "", l)[:260])
print("---- order of big instructions")
for i, line in enumerate(entry.splitlines()):
    if "8,16,1024,1024" in line.split("=")[1][:80] if "=" in line else False:
        print(i, line[:200])
