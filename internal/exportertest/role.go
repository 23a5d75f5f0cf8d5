package exportertest

import "os/exec"

// RoleEnv tells a test binary, re-executed as a child, what to be (an
// instrumented client, an attacker, ...) instead of running its tests.
const RoleEnv = "GPUMEM_TEST_ROLE"

// RoleCommand is the test binary at bin re-executed as role, with
// ChildEnv(env...).
func RoleCommand(bin, role string, env ...string) *exec.Cmd {
	cmd := exec.Command(bin)
	cmd.Env = ChildEnv(append([]string{RoleEnv + "=" + role}, env...)...)
	return cmd
}
