package sandboxd

import (
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// killTree kills pid's process group and every descendant of pid found through /proc, which also
// catches children that left the group (setsid, setpgid).
//
// The tree is frozen with SIGSTOP first, walking /proc again until no new process appears: a
// killed parent's children are reparented at once, so killing top-down would lose the links to
// grandchildren, and a stopped process cannot fork. Then everything gets SIGKILL.
func killTree(pid int) {
	stopped := map[int]bool{}
	for range 10 {
		fresh := false
		for _, p := range descendants(pid) {
			if !stopped[p] {
				_ = unix.Kill(p, unix.SIGSTOP)
				stopped[p] = true
				fresh = true
			}
		}
		if !fresh {
			break
		}
	}
	_ = unix.Kill(-pid, unix.SIGKILL)
	for p := range stopped {
		_ = unix.Kill(p, unix.SIGKILL)
	}
}

// descendants returns root and every process below it, from the ppid links in /proc/*/stat.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []int{root}
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// parentOf reads the ppid from /proc/<pid>/stat: "pid (comm) state ppid …", where comm may hold
// spaces and parentheses, so the fields are counted from the last ')'.
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(string(f[1]))
	return ppid, err == nil
}
