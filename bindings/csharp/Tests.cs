// Test runner for the C# bindings: mono Tests.exe. Prints one line per failure and a final
// "N passed, N failed"; exits non-zero on any failure. Fixtures: $NEEDLE_FIXTURES, else
// ../shared/fixtures relative to the repository root (found from this executable's folder).
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Runtime.InteropServices;
using System.Text.RegularExpressions;
using Needle;

static class Tests
{
    const uint Bos = 2;
    static string fixtures;

    static void Assert(bool ok, string what) { if (!ok) throw new Exception("assertion failed: " + what); }

    static NeedleException Throws(Status want, Action a)
    {
        try { a(); }
        catch (NeedleException e)
        {
            Assert(e.Status == want, $"status {e.Status}, want {want} ({e.Message})");
            return e;
        }
        throw new Exception($"no NeedleException, want {want}");
    }

    static Model Tiny() => new Model(Path.Combine(fixtures, "v2", "models", "tiny.cact"));

    static int Argmax(float[] xs)
    {
        int best = 0;
        for (int i = 1; i < xs.Length; i++) if (xs[i] > xs[best]) best = i;
        return best;
    }

    static string Generate(Model m, GenerateOptions o, out GenerateResult r)
    {
        using (var s = m.NewState()) { r = s.Generate("Hello", o); return r.Text; }
    }

    static NeedleException Catch(Action a)
    {
        try { a(); } catch (NeedleException e) { return e; }
        return null;
    }

    // Every `ldftn M; newobj D::.ctor` in the assembly where D is a delegate type that some
    // DllImport takes: M must be static and carry [MonoPInvokeCallback(typeof(D))] (matched by
    // name, as AOT compilers do). Returns the violations; `found` counts the delegates seen.
    static List<string> NativeCallbackViolations(Assembly asm, out int found)
    {
        var native = new HashSet<Type>();
        foreach (var t in asm.GetTypes())
            foreach (var m in t.GetMethods(BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.Static))
                if (Attribute.IsDefined(m, typeof(DllImportAttribute)))
                    foreach (var p in m.GetParameters())
                        if (typeof(Delegate).IsAssignableFrom(p.ParameterType)) native.Add(p.ParameterType);
        var bad = new List<string>();
        found = 0;
        const BindingFlags all = BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.Instance |
                                 BindingFlags.Static | BindingFlags.DeclaredOnly;
        foreach (var t in asm.GetTypes())
            foreach (var mb in t.GetMethods(all).Cast<MethodBase>().Concat(t.GetConstructors(all)))
            {
                var body = mb.GetMethodBody();
                if (body == null) continue;
                var il = body.GetILAsByteArray();
                for (int i = 0; i + 11 <= il.Length; i++)
                {
                    if (il[i] != 0xFE || il[i + 1] != 0x06 || il[i + 6] != 0x73) continue; // ldftn; newobj
                    MethodBase target, ctor;
                    try { target = mb.Module.ResolveMethod(BitConverter.ToInt32(il, i + 2)); ctor = mb.Module.ResolveMethod(BitConverter.ToInt32(il, i + 7)); }
                    catch (ArgumentException) { continue; }
                    if (!native.Contains(ctor.DeclaringType)) continue;
                    found++;
                    var attr = target.GetCustomAttributes(false).FirstOrDefault(a => a.GetType().Name == "MonoPInvokeCallbackAttribute");
                    var dtype = attr?.GetType().GetProperty("DelegateType")?.GetValue(attr) as Type;
                    if (!target.IsStatic || dtype != ctor.DeclaringType)
                        bad.Add($"{mb.DeclaringType.Name}.{mb.Name} passes {target.DeclaringType.Name}.{target.Name} " +
                                $"(static {target.IsStatic}, [MonoPInvokeCallback(typeof({dtype?.Name ?? "-"}))]) as {ctor.DeclaringType.Name}");
                }
            }
        return bad;
    }

    // The DllImport library names of every import in `asm`.
    static HashSet<string> ImportNames(Assembly asm) =>
        new HashSet<string>(asm.GetTypes().SelectMany(t => t.GetMethods(BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.Static))
            .Select(m => (DllImportAttribute)Attribute.GetCustomAttribute(m, typeof(DllImportAttribute)))
            .Where(a => a != null).Select(a => a.Value));

    const string Weather = "[{\"name\":\"get_weather\",\"description\":\"Get the weather for a city.\"," +
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"," +
        "\"enum\":[\"Paris\",\"Oslo\"]}},\"required\":[\"city\"]}}]";
    static readonly string[] EnvelopeKeys = { "type", "success", "error", "error_code", "reason", "function_calls",
        "suppressed_calls", "reasoning", "confidence", "prefill_tps", "decode_tps", "peak_ram_mb" };

    static readonly List<KeyValuePair<string, Action>> cases = new List<KeyValuePair<string, Action>>
    {
        Case("missing file is IO", () =>
        {
            var e = Throws(Status.Io, () => new Model("/nonexistent/dir/model.cact"));
            Assert(e.Message.Contains("nonexistent"), e.Message);
        }),
        Case("garbage file is FORMAT", () =>
        {
            string path = Path.GetTempFileName();
            File.WriteAllText(path, string.Concat(System.Linq.Enumerable.Repeat("not a needle container", 10)));
            try { Assert(Throws(Status.Format, () => new Model(path)).Message.Length > 0, "message"); }
            finally { File.Delete(path); }
            Throws(Status.Format, () => Model.FromBytes(new byte[] { 1, 2, 3 }));
        }),
        Case("ABI guard", () =>
        {
            Assert(NativeMethods.needle_check_abi(999) == 4, "needle_check_abi(999) == 4");
            Assert(NativeMethods.needle_check_abi(NativeMethods.AbiVersion) == 0, "check_abi(1) == 0");
            Assert(Throws(Status.Unsupported, () => Library.CheckAbi(999)).Message.Contains("999"), "message names 999");
            Assert(Library.AbiVersion == NativeMethods.AbiVersion && Library.Version.Length > 0, "versions");
        }),
        Case("struct layouts match needle.h", () =>
        {
            Assert(Marshal.SizeOf(typeof(NativeMethods.GenerateParams)) == 40, "generate params 40");
            Assert(Marshal.SizeOf(typeof(NativeMethods.GenerateResult)) == 32, "generate result 32");
            Assert(Marshal.SizeOf(typeof(NativeMethods.ModelInfo)) == 120, "model info 120");
            Assert(Marshal.OffsetOf(typeof(NativeMethods.ModelInfo), "out_vocab").ToInt32() == 88, "out_vocab at 88");
            Assert(Marshal.OffsetOf(typeof(NativeMethods.ModelInfo), "global_layer_mask").ToInt32() == 96, "mask at 96");
            Assert(Marshal.OffsetOf(typeof(NativeMethods.ModelInfo), "n_threads").ToInt32() == 116, "n_threads at 116");
            Assert(Marshal.SizeOf(typeof(NativeMethods.ModelParams)) == 16, "model params 16");
            Assert(Marshal.SizeOf(typeof(NativeMethods.StateParams)) == 16, "state params 16");
            Assert(Marshal.OffsetOf(typeof(NativeMethods.GenerateParams), "seed").ToInt32() == 24, "seed at 24");
        }),
        Case("info and tokenizer", () =>
        {
            using (var m = Tiny())
            {
                Assert(m.Info.VocabSize == 1024 && m.Info.DModel == 128 && m.Info.BosId == Bos && m.Info.HasTokenizer, "info");
                string text = "The quick brown fox, caf\u00e9 \u2603";
                var ids = m.Tokenize(text, true);
                Assert(ids[0] == Bos, "BOS first");
                Assert(m.Detokenize(ids) == text, "roundtrip");
            }
        }),
        Case("BOS logits match reference", () =>
        {
            var raw = File.ReadAllBytes(Path.Combine(fixtures, "v2", "refs", "tiny", "empty.full.f32"));
            var reference = new float[1024];
            Buffer.BlockCopy(raw, 0, reference, 0, 4096); // little-endian host
            using (var m = Tiny())
            using (var s = m.NewState())
            {
                var logits = s.Decode(Bos);
                Assert(s.Position == 1, "pos 1");
                Assert(Argmax(logits) == Argmax(reference), "argmax");
                for (int i = 0; i < 1024; i++)
                    Assert(Math.Abs(logits[i] - reference[i]) <= 1e-4, $"logit {i}: {logits[i]} vs {reference[i]}");
            }
        }),
        Case("raw FFI equals safe API", () =>
        {
            using (var m = Tiny())
            {
                StateHandle raw;
                Assert(NativeMethods.needle_state_create(m.Handle, out raw) == 0, "raw create");
                var a = new float[1024];
                using (raw) Assert(NativeMethods.needle_state_decode(raw, Bos, a, (UIntPtr)1024) == 0, "raw decode");
                float[] b;
                using (var s = m.NewState()) b = s.Decode(Bos);
                for (int i = 0; i < 1024; i++) Assert(a[i] == b[i], $"logit {i}");
            }
        }),
        Case("batched prefill equals decode", () =>
        {
            using (var m = Tiny())
            using (var a = m.NewState())
            using (var b = m.NewState())
            using (var batch = m.NewBatch(4))
            {
                var ids = m.Tokenize("hello there, general", true);
                float[] last = null;
                foreach (var id in ids) last = a.Decode(id);
                var chunked = new float[1024];
                b.Prefill(ids, batch, chunked);
                Assert(a.Position == b.Position, "positions");
                for (int i = 0; i < 1024; i++) Assert(last[i] == chunked[i], $"logit {i}");
            }
        }),
        Case("decode_many equals decode", () =>
        {
            using (var m = Tiny())
            using (var a = m.NewState()) using (var b = m.NewState())
            using (var c = m.NewState()) using (var d = m.NewState())
            using (var batch = m.NewBatch(4))
            {
                a.Decode(7, null);  // different positions
                c.Decode(7, null);
                for (uint step = 0; step < 3; step++)
                {
                    var la = new float[1024];
                    var lb = new float[1024];
                    State.DecodeMany(new[] { a, b }, new[] { 30 + step, 40 + step }, new[] { la, lb }, batch);
                    var wa = c.Decode(30 + step);
                    var wb = d.Decode(40 + step);
                    for (int i = 0; i < 1024; i++) Assert(la[i] == wa[i] && lb[i] == wb[i], $"step {step} logit {i}");
                }
                Assert(a.Position == 4 && b.Position == 3, "positions");
                Throws(Status.InvalidArgument, () => State.DecodeMany(new[] { a, b }, new uint[] { 1, 5000 }, null, batch));
                Throws(Status.InvalidArgument, () => State.DecodeMany(new[] { a, a }, new uint[] { 1, 2 }, null, batch));
                Throws(Status.InvalidArgument, () => State.DecodeMany(new[] { a, b }, new uint[] { 1 }, null, batch));
                Throws(Status.BufferTooSmall, () => State.DecodeMany(new[] { a, b }, new uint[] { 1, 2 }, new[] { new float[10], new float[1024] }, batch));
                Assert(a.Position == 4 && b.Position == 3, "no state moved");
            }
        }),
        Case("errors carry status and message", () =>
        {
            using (var m = Tiny())
            using (var s = m.NewState())
            {
                Assert(Throws(Status.InvalidArgument, () => s.Decode(5000, null)).Message.Contains("vocab_size"), "message");
                Throws(Status.BufferTooSmall, () => s.Decode(Bos, new float[10]));
                Throws(Status.ContextFull, () => s.Prefill(new uint[m.Info.MaxSeqLen + 1], null, null));
                Assert(s.Position == 0, "state unchanged");
            }
        }),
        Case("seeded generation is reproducible", () =>
        {
            using (var m = Tiny())
            {
                var o = new GenerateOptions { MaxTokens = 16, Temperature = 0.8f, Seed = 7 };
                GenerateResult r1, r2;
                string a = Generate(m, o, out r1), b = Generate(m, o, out r2);
                Assert(a == b && r1.GeneratedTokens > 0, $"'{a}' vs '{b}'");
                Assert(m.Detokenize(r1.Tokens) == a, "detokenize equals stream");
            }
        }),
        Case("callback stop and exception", () =>
        {
            using (var m = Tiny())
            using (var s = m.NewState())
            {
                int n = 0;
                var r = s.Generate("Hello", null, null, (id, text) => ++n == 3);
                Assert(r.StopReason == StopReason.Callback && r.GeneratedTokens == 3, "stopped after 3");
                bool caught = false;
                try { s.Generate(" more", null, null, (id, text) => { throw new InvalidOperationException("from callback"); }); }
                catch (InvalidOperationException e) { caught = e.Message == "from callback"; }
                Assert(caught, "callback exception rethrown");
                s.Decode(Bos, null);
            }
        }),
        Case("native callbacks are static [MonoPInvokeCallback] methods (IL2CPP / AOT)", () =>
        {
            int found;
            var bad = NativeCallbackViolations(typeof(Model).Assembly, out found);
            Assert(found >= 1, "no delegate handed to native code was found: the scan is broken");
            Assert(bad.Count == 0, string.Join("; ", bad));
        }),
        Case("DllImport name: needle, or __Internal with NEEDLE_STATIC", () =>
        {
            var names = ImportNames(typeof(Model).Assembly);
            Assert(names.SetEquals(new[] { "needle" }), "imports: " + string.Join(",", names));
            string staticDll = Path.Combine(AppDomain.CurrentDomain.BaseDirectory, "NeedleStatic.dll");
            Assert(File.Exists(staticDll), "build.sh builds NeedleStatic.dll (-define:NEEDLE_STATIC)");
            var staticNames = ImportNames(Assembly.LoadFile(staticDll));
            Assert(staticNames.SetEquals(new[] { "__Internal" }), "static imports: " + string.Join(",", staticNames));
        }),
        Case("state is busy inside its own callback", () =>
        {
            using (var m = Tiny())
            using (var s = m.NewState())
            using (var other = m.NewState())
            {
                var seen = new List<NeedleException>();
                var r = s.Generate("Hello", new GenerateOptions { MaxTokens = 4 }, null, (id, text) =>
                {
                    if (seen.Count > 0) return false;
                    seen.Add(Catch(() => s.Decode(5, null)));
                    seen.Add(Catch(() => s.Prefill(new uint[] { 5 }, null, null)));
                    seen.Add(Catch(() => s.Generate("x")));
                    other.Decode(5, null); // another state is free to use
                    return false;
                });
                Assert(seen.Count == 3, "three calls");
                foreach (var e in seen)
                    Assert(e != null && e.Status == Status.InvalidArgument && e.Message.Contains("state is busy in needle_generate"),
                           e == null ? "call accepted" : e.Status + ": " + e.Message);
                Assert(other.Position == 1, "other state fed");
                Assert(s.Position == r.PromptTokens + r.GeneratedTokens, "sequence unchanged by the refused calls");
            }
        }),
        Case("ABI is checked before any other function (stub libraries)", () =>
        {
            if (!File.Exists("/usr/bin/cc")) return; // no compiler: nothing to build stubs with
            var stubs = new[]
            {
                new[] { "int32_t needle_check_abi(uint32_t v) { return v == 1 ? 0 : 4; }\nconst char *needle_last_error(void) { return \"\"; }", "has no needle_" },
                new[] { "int32_t needle_check_abi(uint32_t v) { (void)v; return 4; }\nconst char *needle_last_error(void) { return \"stub implements ABI 2\"; }", "stub implements ABI 2" },
                new[] { "int needle_other(void) { return 0; }", "has no needle_check_abi" },
            };
            foreach (var stub in stubs)
            {
                string dir = Path.Combine(Path.GetTempPath(), "needle-cs-stub-" + Guid.NewGuid().ToString("N"));
                Directory.CreateDirectory(dir);
                try
                {
                    File.WriteAllText(Path.Combine(dir, "stub.c"), "#include <stdint.h>\n" + stub[0] + "\n");
                    Assert(Run("/usr/bin/cc", $"-shared -fPIC -o {dir}/libneedle.so {dir}/stub.c", null) != null, "cc");
                    string exe = Assembly.GetExecutingAssembly().Location;
                    string mono = Process.GetCurrentProcess().MainModule.FileName;
                    string output = Run(mono, $"\"{exe}\" --abi-probe", dir) ?? "";
                    Assert(output.StartsWith("NeedleException Unsupported") && output.Contains(stub[1]), "probe said: " + output);
                }
                finally { Directory.Delete(dir, true); }
            }
        }),
        Case("probe heads match the reference; copy, save and load continue identically", () =>
        {
            using (var m = Tiny())
            using (var s = m.NewState())
            using (var c = m.NewState())
            using (var l = m.NewState())
            {
                Throws(Status.InvalidArgument, () => s.Confidence());
                s.Decode(Bos);
                double p = s.Confidence();
                double logit = Math.Log(p) - Math.Log(1 - p);
                Assert(Math.Abs(logit - (-4.647948265075684)) < 1e-3, "confidence logit " + logit);
                var raw = File.ReadAllBytes(Path.Combine(fixtures, "v2", "refs", "tiny", "empty.contrastive.f32"));
                var emb = s.Embedding();
                Assert(emb.Length * 4 == raw.Length, "embedding dim");
                for (int i = 0; i < emb.Length; i++)
                    Assert(Math.Abs(emb[i] - BitConverter.ToSingle(raw, 4 * i)) < 1e-4, "embedding " + i);
                var blob = s.Save();
                c.CopyFrom(s);
                l.Load(blob);
                var want = s.Decode(7);
                Assert(want.SequenceEqual(c.Decode(7)), "copy continues");
                Assert(want.SequenceEqual(l.Decode(7)), "load continues");
                blob[blob.Length / 2] ^= 1;
                Throws(Status.Format, () => l.Load(blob));
                Assert(l.Position == 2, "state unchanged");
            }
        }),
        Case("handles dispose in any order", () =>
        {
            var m = Tiny();
            var s = m.NewState();
            var batch = m.NewBatch(8);
            m.Dispose(); // the C library keeps the model alive for s and batch
            m.Dispose();
            var r = s.Generate("Hello", new GenerateOptions { MaxTokens = 4 }, batch);
            Assert(r.GeneratedTokens == 4, "generated 4");
            Assert(s.Decode(Bos).Length == 1024, "decode after model dispose");
            batch.Dispose();
            s.Dispose();
            bool disposed = false;
            try { s.Decode(Bos); } catch (ObjectDisposedException) { disposed = true; }
            Assert(disposed, "use after dispose throws ObjectDisposedException");
        }),
        Case("chat render and canonical tools", () =>
        {
            using (var m = Tiny())
            using (var chat = new Chat(m, "date: 2026-07-21", Weather))
            {
                Assert(chat.ToolsJson == Weather, chat.ToolsJson);
                string want = "<|im_start|>system\ndate: 2026-07-21<|im_end|>\n<|im_start|>user\n<tools>" + Weather +
                              "</tools>\nParis?<|im_end|>\n<|im_start|>assistant\n";
                Assert(chat.Render("Paris?") == want, chat.Render("Paris?"));
            }
        }),
        Case("chat required call, reset, truncation, bad tools", () =>
        {
            using (var m = Tiny())
            using (var chat = new Chat(m, "", Weather, new ChatOptions { ToolChoice = ToolChoice.Required }))
            {
                string env = chat.Complete("What's the weather in Paris?", 64);
                AssertKeyOrder(env);
                Assert(env.StartsWith("{\"type\":\"call\",\"success\":true,\"error\":null,\"error_code\":null,", StringComparison.Ordinal), env);
                string paris = "\"function_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]";
                string oslo = paris.Replace("Paris", "Oslo");
                Assert(env.Contains(paris) || env.Contains(oslo), env);
                chat.Reset();
                string again = chat.Complete("What's the weather in Paris?", 64);
                Assert(again.Contains(env.Contains(paris) ? paris : oslo), again);
                chat.Reset();
                string shortEnv = chat.Complete("Paris?", 3);
                Assert(shortEnv.Contains("\"success\":false") && shortEnv.Contains("\"error_code\":\"truncated\""), shortEnv);
                var e = Throws(Status.InvalidArgument, () => new Chat(m, "", "[{\"name\": 3}]"));
                Assert(e.Message.Contains("name"), e.Message);
            }
        }),
        Case("builtin model: its four tools, and a timer query calls set_timer {seconds: 300}", () =>
        {
            string tools = Library.BuiltinToolsJson;
            if (tools == null)
            {
                // Library built with NEEDLE_BUILTIN_MODEL=OFF: the loader must say so.
                Throws(Status.Unsupported, () => Model.Builtin());
                Console.WriteLine("skip builtin model: libneedle built without its demo model");
                return;
            }
            var names = Regex.Matches(tools, "\"name\"\\s*:\\s*\"([^\"]*)\"").Cast<Match>().Select(x => x.Groups[1].Value).ToArray();
            Assert(names.SequenceEqual(new[] { "set_timer", "set_lights", "get_weather", "send_message" }),
                   "builtin tool names: " + string.Join(",", names));
            Throws(Status.InvalidArgument, () => Model.Builtin(threads: -1));
            using (var m = Model.Builtin(threads: 1))
            using (var chat = new Chat(m, "", tools))
            {
                Assert(m.Info.HasTokenizer && m.Info.FormatVersion == 2 && m.Info.NThreads == 1, "builtin info");
                string env = chat.Complete("Set a timer for 5 minutes", 256);
                AssertKeyOrder(env);
                Assert(env.StartsWith("{\"type\":\"call\",\"success\":true,", StringComparison.Ordinal), env);
                Assert(env.Contains("\"function_calls\":[{\"name\":\"set_timer\",\"arguments\":{\"seconds\":300}}]"), env);
            }
        }),
        // ---------------------------------------------------------- Needle 3 (issue 8)
        Case("Needle 3: tiny3 info, greedy ids, depth ladder, max_tokens, confidence", Needle3Tiny3),
    };

    static uint[] ReadU32(string path)
    {
        var raw = File.ReadAllBytes(path);
        var out_ = new uint[raw.Length / 4];
        Buffer.BlockCopy(raw, 0, out_, 0, out_.Length * 4);
        return out_;
    }

    // tiny3 (fixtures/v3 manifest case tiny3__chat__f32) through the binding.
    static void Needle3Tiny3()
    {
        string v3 = Path.Combine(fixtures, "v3"), path = Path.Combine(v3, "models", "tiny3.cact");
        var prompt = ReadU32(Path.Combine(v3, "refs", "tiny3__chat__f32.prompt.u32"));
        var rawRef = File.ReadAllBytes(Path.Combine(v3, "refs", "tiny3__chat__f32.prefill.f32"));
        var reference = new float[rawRef.Length / 4];
        Buffer.BlockCopy(rawRef, 0, reference, 0, rawRef.Length);
        using (var m = new Model(path))
        {
            Assert(m.Info.FormatVersion == 3 && m.Info.OutVocab == 512 && m.Info.HasConfidenceHead, "tiny3 info");
            // Greedy: the manifest's first two generated ids; the state holds exactly the prompt.
            using (var s = m.NewState(maxTokens: (uint)prompt.Length))
            {
                Assert(s.VocabSize == 512, "logits size out_vocab");
                var logits = new float[s.VocabSize];
                s.Prefill(prompt, null, logits);
                float worst = 0;
                for (int i = 0; i < logits.Length; i++) worst = Math.Max(worst, Math.Abs(logits[i] - reference[i]));
                Assert(worst <= 2e-4f, $"prefill max |d| {worst}");
                Assert(Argmax(logits) == 35, "greedy id 35");
                float p = s.Confidence();
                double want = 1 / (1 + Math.Exp(-0.47859019));
                Assert(p > 0 && p < 1 && Math.Abs(p - want) <= 1e-4, $"confidence {p}, want {want}");
                Throws(Status.ContextFull, () => s.Decode(35, logits));
                Assert(s.Position == prompt.Length, "state unchanged after CONTEXT_FULL");
            }
            using (var s = m.NewState())
            {
                s.Prefill(prompt, null, null);
                Assert(Argmax(s.Decode(35)) == 32, "greedy id 32");
                s.Reset();
                var r = s.Generate("Hello", new GenerateOptions { MaxTokens = 3 });
                Assert(r.GeneratedTokens <= 3 && r.PromptTokens > 1 &&
                       (r.StopReason == StopReason.MaxTokens || r.StopReason == StopReason.Eos), "generate");
            }
        }
        using (var d2 = new Model(path, depth: 2)) Assert(d2.Info.NumLayers == 2, "depth 2 runs 2 layers");
        Throws(Status.InvalidArgument, () => new Model(path, depth: 1));
    }

    // Every top-level key of an envelope present, in the documented order.
    static void AssertKeyOrder(string env)
    {
        int last = 0;
        foreach (var k in EnvelopeKeys)
        {
            int at = env.IndexOf("\"" + k + "\":", StringComparison.Ordinal);
            Assert(at >= last, $"key {k} missing or out of order in {env}");
            last = at;
        }
    }

    static KeyValuePair<string, Action> Case(string name, Action a) => new KeyValuePair<string, Action>(name, a);

    // Runs a program; returns its stdout (null if it failed to start or exited non-zero).
    // `libDir` != null puts that folder first on LD_LIBRARY_PATH.
    static string Run(string file, string args, string libDir)
    {
        var psi = new ProcessStartInfo(file, args) { UseShellExecute = false, RedirectStandardOutput = true };
        if (libDir != null) psi.EnvironmentVariables["LD_LIBRARY_PATH"] = libDir;
        using (var p = Process.Start(psi))
        {
            string output = p.StandardOutput.ReadToEnd();
            p.WaitForExit();
            return p.ExitCode == 0 ? output.Trim() : null;
        }
    }

    // Child mode of the stub test: the first load must fail with Unsupported, not EntryPointNotFound.
    static int AbiProbe()
    {
        try { new Model("/nonexistent.cact").Dispose(); Console.WriteLine("loaded"); }
        catch (NeedleException e) { Console.WriteLine($"NeedleException {e.Status}: {e.Message}"); }
        catch (Exception e) { Console.WriteLine($"{e.GetType().Name}: {e.Message}"); }
        return 0;
    }

    static int Main(string[] args)
    {
        if (args.Length == 1 && args[0] == "--abi-probe") return AbiProbe();
        fixtures = Environment.GetEnvironmentVariable("NEEDLE_FIXTURES");
        if (string.IsNullOrEmpty(fixtures)) // <repo>/bindings/csharp/bin/Tests.exe -> <repo>/../shared/fixtures
            fixtures = Path.GetFullPath(Path.Combine(AppDomain.CurrentDomain.BaseDirectory, "..", "..", "..", "..", "shared", "fixtures"));
        int passed = 0, failed = 0;
        foreach (var c in cases)
        {
            try { c.Value(); passed++; }
            catch (Exception e) { failed++; Console.WriteLine($"FAIL {c.Key}: {e.Message}"); }
        }
        Console.WriteLine($"{passed} passed, {failed} failed");
        return failed == 0 ? 0 : 1;
    }
}
