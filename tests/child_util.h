// Runs a program of the build as a child process (fork + exec) with fd 1 and 2 captured, for the
// tests that need a fresh process (a crash, a one-time warning, the ISA choice, a command line).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace child_test {

struct ChildResult {
    int status = -1;     // exit code, or 128 + signal
    std::string output;  // everything the child wrote to fd 1 and 2, in order
};

// `exe` with `args`; `env` ("NAME=value", or "NAME" to unset) is applied in the child only.
inline ChildResult run_child(const std::string &exe, const std::vector<std::string> &args,
                             const std::vector<std::string> &env = {}) {
    char path[] = "/tmp/needle-child-out.XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    unlink(path);
    std::vector<std::string> argv_s{exe};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char *> argv;
    for (std::string &a : argv_s) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    std::vector<std::string> env_s = env;  // prepared before fork: the child only calls exec-safe functions
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        for (std::string &e : env_s) {
            const size_t eq = e.find('=');
            if (eq == std::string::npos) unsetenv(e.c_str());
            else e[eq] = '\0', setenv(e.c_str(), e.c_str() + eq + 1, 1);
        }
        dup2(fd, 1), dup2(fd, 2);
        execv(argv[0], argv.data());
        _exit(127);
    }
    int ws = 0;
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    ChildResult r;
    r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    lseek(fd, 0, SEEK_SET);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) r.output.append(buf, size_t(n));
    close(fd);
    return r;
}

}  // namespace child_test
