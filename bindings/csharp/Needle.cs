// C# bindings for libneedle, the Needle inference engine (P/Invoke; builds with mono's mcs, C# 7).
//
//   using (var model = new Needle.Model("model.cact"))
//   using (var state = model.NewState())
//       state.Generate("Hello", null, null, (id, text) => { Console.Write(text); return false; });
//
// Model is immutable and thread-safe; State and Batch are used by one thread at a time. Each owns a
// SafeHandle, so Dispose is idempotent and the finalizer frees a forgotten handle. Handles may be
// disposed in any order: the C library keeps a model alive while its states and batches exist.
// Failures throw NeedleException (Status + the library's message, read right after the failing
// call on the same thread). Text crosses the boundary as UTF-8 byte arrays, encoded by hand.
// The library is loaded as "needle" (libneedle.so): put its directory in LD_LIBRARY_PATH. Compiled
// with -define:NEEDLE_STATIC the imports name "__Internal" instead (a statically linked iOS build).
// AOT runtimes (Unity IL2CPP, Xamarin.iOS) marshal only static callbacks: every delegate handed to
// native code targets a static method marked [MonoPInvokeCallback(typeof(...))], and the context
// of a call travels through user_data as a GCHandle.
using System;
using System.Runtime.ExceptionServices;
using System.Runtime.InteropServices;
using System.Text;
using Microsoft.Win32.SafeHandles;

namespace Needle
{
    /// <summary>needle_status codes.</summary>
    public enum Status
    {
        Ok = 0, InvalidArgument = 1, Io = 2, Format = 3, Unsupported = 4, NoMemory = 5,
        ContextFull = 6, BufferTooSmall = 7, Cancelled = 8, Internal = 9,
    }

    /// <summary>Why Generate stopped (NEEDLE_STOP_*).</summary>
    public enum StopReason { None = 0, Eos = 1, MaxTokens = 2, ContextFull = 3, Callback = 4 }

    /// <summary>A failed libneedle call: Status and the library's Message.</summary>
    public class NeedleException : Exception
    {
        public Status Status { get; }

        public NeedleException(Status status, string message) : base(message) { Status = status; }

        public override string ToString() =>
            $"NeedleException: {NativeMethods.StatusString(Status)} (status {(int)Status}): {Message}";
    }

    /// <summary>Marks a static method that native code calls back (Unity IL2CPP and Xamarin AOT
    /// look for an attribute of this name; it is declared here so no Unity assembly is needed).</summary>
    [AttributeUsage(AttributeTargets.Method)]
    public sealed class MonoPInvokeCallbackAttribute : Attribute
    {
        public Type DelegateType { get; }
        public MonoPInvokeCallbackAttribute(Type delegateType) { DelegateType = delegateType; }
    }

    // ------------------------------------------------------------------ handles

    public sealed class ModelHandle : SafeHandleZeroOrMinusOneIsInvalid
    {
        public ModelHandle() : base(true) { }
        protected override bool ReleaseHandle() { NativeMethods.needle_model_free(handle); return true; }
    }

    public sealed class StateHandle : SafeHandleZeroOrMinusOneIsInvalid
    {
        public StateHandle() : base(true) { }
        protected override bool ReleaseHandle() { NativeMethods.needle_state_free(handle); return true; }
    }

    public sealed class BatchHandle : SafeHandleZeroOrMinusOneIsInvalid
    {
        public BatchHandle() : base(true) { }
        protected override bool ReleaseHandle() { NativeMethods.needle_batch_free(handle); return true; }
    }

    // ------------------------------------------------------------------ raw declarations

    /// <summary>The C functions of needle.h, declared as they are (ABI 1).</summary>
    public static partial class NativeMethods
    {
        public const uint AbiVersion = 1; // NEEDLE_ABI_VERSION these declarations follow
        public const uint NoToken = 0xFFFFFFFF;
#if NEEDLE_STATIC
        const string Lib = "__Internal";
#else
        const string Lib = "needle";
#endif

        [StructLayout(LayoutKind.Sequential)]
        public struct ModelParams { public uint struct_size; public int use_mmap; public int n_threads; public uint depth; }

        [StructLayout(LayoutKind.Sequential)]
        public struct StateParams { public uint struct_size; public int kv_window; public int kv_type; public uint max_tokens; }

        [StructLayout(LayoutKind.Sequential)]
        public struct ModelInfo
        {
            public uint struct_size, format_version, vocab_size, d_model, num_layers, num_heads,
                num_kv_heads, head_dim, v_head_dim, max_seq_len, kv_window, mhc_lanes,
                num_engram_sites, bos_id, eos_id, pad_id, unk_id, has_tokenizer;
            public ulong weight_bytes, file_bytes;
            // added by issue 8 (Needle 3), then n_threads (issue 13): needle.h order
            public uint out_vocab;
            public ulong global_layer_mask;
            public uint qkv_conv_taps, has_confidence_head, has_contrastive_head, n_threads;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct GenerateParams
        {
            public uint struct_size, max_tokens;
            public float temperature;
            public int top_k;
            public float top_p;
            public ulong seed;
            public int add_bos;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct GenerateResult
        {
            public uint struct_size, prompt_tokens, generated_tokens, stop_reason;
            public double prefill_ms, decode_ms;
        }

        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        public delegate int TokenCallback(uint token, IntPtr text, UIntPtr textLen, IntPtr userData);

        [DllImport(Lib)] public static extern uint needle_abi_version();
        [DllImport(Lib)] public static extern IntPtr needle_version_string();
        [DllImport(Lib)] public static extern int needle_check_abi(uint expected);
        [DllImport(Lib)] public static extern IntPtr needle_status_string(int status);
        [DllImport(Lib)] public static extern IntPtr needle_last_error();

        [DllImport(Lib)] public static extern void needle_model_params_init(ref ModelParams p);
        [DllImport(Lib)] public static extern int needle_model_load_file(byte[] path, ref ModelParams p, out ModelHandle model);
        [DllImport(Lib)] public static extern int needle_model_load_memory(byte[] data, UIntPtr size, ref ModelParams p, out ModelHandle model);
        [DllImport(Lib)] public static extern int needle_model_load_builtin(ref ModelParams p, out ModelHandle model);
        [DllImport(Lib)] public static extern IntPtr needle_builtin_tools_json(); // static text or NULL
        [DllImport(Lib)] public static extern void needle_model_free(IntPtr model);
        [DllImport(Lib)] public static extern int needle_model_get_info(ModelHandle model, ref ModelInfo info);

        [DllImport(Lib)] public static extern int needle_state_create(ModelHandle model, out StateHandle state);
        [DllImport(Lib)] public static extern void needle_state_params_init(ref StateParams p);
        [DllImport(Lib)] public static extern int needle_state_create_ex(ModelHandle model, ref StateParams p, out StateHandle state);
        [DllImport(Lib)] public static extern void needle_state_free(IntPtr state);
        [DllImport(Lib)] public static extern void needle_state_reset(StateHandle state);
        [DllImport(Lib)] public static extern uint needle_state_pos(StateHandle state);
        [DllImport(Lib)] public static extern int needle_batch_create(ModelHandle model, uint capacity, out BatchHandle batch);
        [DllImport(Lib)] public static extern void needle_batch_free(IntPtr batch);

        [DllImport(Lib)] public static extern int needle_state_decode(StateHandle state, uint token, [In, Out] float[] logits, UIntPtr logitsLen);
        [DllImport(Lib)] public static extern int needle_decode_many(IntPtr[] states, uint[] tokens, UIntPtr n, IntPtr[] logits, UIntPtr logitsLen, BatchHandle scratch);
        [DllImport(Lib)] public static extern int needle_state_prefill(StateHandle state, IntPtr batch, uint[] tokens, UIntPtr nTokens, [In, Out] float[] logits, UIntPtr logitsLen);

        [DllImport(Lib)] public static extern int needle_model_tokenize(ModelHandle model, byte[] text, UIntPtr textLen, int addBos, [In, Out] uint[] tokens, UIntPtr capacity, out UIntPtr nTokens);
        [DllImport(Lib)] public static extern int needle_model_detokenize(ModelHandle model, uint[] tokens, UIntPtr nTokens, [In, Out] byte[] text, UIntPtr capacity, out UIntPtr textLen);

        // probe heads and state persistence (issue 9)
        [DllImport(Lib)] public static extern int needle_state_confidence(StateHandle state, out float probability);
        [DllImport(Lib)] public static extern int needle_state_embedding(StateHandle state, [In, Out] float[] output, UIntPtr outLen, out UIntPtr dim);
        [DllImport(Lib)] public static extern int needle_state_copy(StateHandle dst, StateHandle src);
        [DllImport(Lib)] public static extern int needle_state_save(StateHandle state, [In, Out] byte[] buf, UIntPtr cap, out UIntPtr len);
        [DllImport(Lib)] public static extern int needle_state_load(StateHandle state, byte[] buf, UIntPtr len);

        [DllImport(Lib)] public static extern void needle_generate_params_init(ref GenerateParams p);
        [DllImport(Lib)] public static extern int needle_generate(StateHandle state, IntPtr batch, byte[] prompt, UIntPtr promptLen, ref GenerateParams p, TokenCallback callback, IntPtr userData, ref GenerateResult result);

        /// <summary>Decodes a NUL-terminated UTF-8 C string by hand.</summary>
        public static string Utf8(IntPtr p)
        {
            if (p == IntPtr.Zero) return "";
            int n = 0;
            while (Marshal.ReadByte(p, n) != 0) n++;
            var bytes = new byte[n];
            Marshal.Copy(p, bytes, 0, n);
            return Encoding.UTF8.GetString(bytes);
        }

        /// <summary>UTF-8 bytes plus a terminating NUL.</summary>
        public static byte[] CString(string s)
        {
            var bytes = new byte[Encoding.UTF8.GetByteCount(s) + 1];
            Encoding.UTF8.GetBytes(s, 0, s.Length, bytes, 0);
            return bytes;
        }

        public static string StatusString(Status s) => Utf8(needle_status_string((int)s));

        /// <summary>Throws NeedleException for a failed status, with this thread's last error.</summary>
        public static void Check(int status)
        {
            if (status != 0) throw new NeedleException((Status)status, Utf8(needle_last_error()));
        }
    }

    // ------------------------------------------------------------------ library

    public static class Library
    {
        static readonly object gate = new object();
        static bool abiChecked;

        public static string Version { get { EnsureAbi(); return NativeMethods.Utf8(NativeMethods.needle_version_string()); } }
        public static uint AbiVersion { get { EnsureAbi(); return NativeMethods.needle_abi_version(); } }

        /// <summary>The JSON array of tool schemas the built-in model (Model.Builtin) was trained for
        /// (needle_builtin_tools_json, models/needle-demo.tools.json), ready for new Chat(model, "",
        /// toolsJson); a managed copy of the library's static text. null when the library was built
        /// without its demo model (CMake NEEDLE_BUILTIN_MODEL=OFF), exactly when Model.Builtin throws
        /// Unsupported. Like Version, throws NeedleException(Unsupported) if the library fails the ABI
        /// check.</summary>
        public static string BuiltinToolsJson
        {
            get
            {
                EnsureAbi();
                IntPtr p = NativeMethods.needle_builtin_tools_json();
                return p == IntPtr.Zero ? null : NativeMethods.Utf8(p);
            }
        }

        /// <summary>Throws NeedleException(Unsupported) unless the library implements `expected`
        /// (also when it has no needle_check_abi at all).</summary>
        public static void CheckAbi(uint expected)
        {
            int st;
            try { st = NativeMethods.needle_check_abi(expected); }
            catch (EntryPointNotFoundException)
            {
                throw new NeedleException(Status.Unsupported, "the library has no needle_check_abi: not libneedle, or older than its first ABI");
            }
            NativeMethods.Check(st);
        }

        /// <summary>The load-time guard, run once before the first load: checks NativeMethods.AbiVersion
        /// before any other function is resolved, then binds every import at once, so a library
        /// lacking one fails here with Unsupported instead of EntryPointNotFoundException later.</summary>
        internal static void EnsureAbi()
        {
            lock (gate)
            {
                if (abiChecked) return;
                CheckAbi(NativeMethods.AbiVersion);
                foreach (var m in typeof(NativeMethods).GetMethods(System.Reflection.BindingFlags.Public | System.Reflection.BindingFlags.Static))
                {
                    if (!Attribute.IsDefined(m, typeof(DllImportAttribute))) continue;
                    try { Marshal.Prelink(m); }
                    catch (EntryPointNotFoundException)
                    {
                        throw new NeedleException(Status.Unsupported, $"the library implements needle ABI {NativeMethods.AbiVersion} but has no {m.Name}");
                    }
                    catch (NotSupportedException) { } // a runtime without eager binding
                }
                abiChecked = true;
            }
        }
    }

    // ------------------------------------------------------------------ model

    /// <summary>Geometry and special ids of a model.</summary>
    public sealed class ModelInfo
    {
        public uint FormatVersion, VocabSize, DModel, NumLayers, NumHeads, NumKvHeads, HeadDim,
            VHeadDim, MaxSeqLen, KvWindow, MhcLanes, NumEngramSites, BosId, EosId, PadId, UnkId;
        public bool HasTokenizer;
        public ulong WeightBytes, FileBytes;
        /// <summary>Logits rows: every logits buffer holds this many floats (Needle 2: VocabSize).</summary>
        public uint OutVocab;
        /// <summary>Bit l set: layer l (as run, after the depth ladder) attends globally; Needle 2: 0.</summary>
        public ulong GlobalLayerMask;
        /// <summary>Taps of the causal Q/K/V conv (Needle 3), 0 = none.</summary>
        public uint QkvConvTaps;
        public bool HasConfidenceHead, HasContrastiveHead;
        /// <summary>Worker threads the model's states run with (threads as clamped).</summary>
        public uint NThreads;

        internal ModelInfo(NativeMethods.ModelInfo i)
        {
            FormatVersion = i.format_version; VocabSize = i.vocab_size; DModel = i.d_model;
            NumLayers = i.num_layers; NumHeads = i.num_heads; NumKvHeads = i.num_kv_heads;
            HeadDim = i.head_dim; VHeadDim = i.v_head_dim; MaxSeqLen = i.max_seq_len;
            KvWindow = i.kv_window; MhcLanes = i.mhc_lanes; NumEngramSites = i.num_engram_sites;
            BosId = i.bos_id; EosId = i.eos_id; PadId = i.pad_id; UnkId = i.unk_id;
            HasTokenizer = i.has_tokenizer != 0; WeightBytes = i.weight_bytes; FileBytes = i.file_bytes;
            OutVocab = i.out_vocab; GlobalLayerMask = i.global_layer_mask; QkvConvTaps = i.qkv_conv_taps;
            HasConfidenceHead = i.has_confidence_head != 0; HasContrastiveHead = i.has_contrastive_head != 0;
            NThreads = i.n_threads;
        }
    }

    /// <summary>A loaded .cact container. Immutable and thread-safe.</summary>
    public sealed class Model : IDisposable
    {
        public ModelHandle Handle { get; }
        public ModelInfo Info { get; }

        /// <summary>Loads a container file. depth: Needle 3 depth-ladder rung (0 = all layers,
        /// 2..num_layers = that many; anything else INVALID_ARGUMENT; Needle 2 accepts only 0).</summary>
        public Model(string path, bool useMmap = true, int threads = 0, uint depth = 0)
        {
            Library.EnsureAbi();
            var p = Params(useMmap, threads, depth);
            ModelHandle h;
            int st = NativeMethods.needle_model_load_file(NativeMethods.CString(path), ref p, out h);
            Handle = h;
            Info = Load(st);
        }

        Model(byte[] data, int threads, uint depth)
        {
            Library.EnsureAbi();
            var p = Params(true, threads, depth);
            ModelHandle h;
            int st = NativeMethods.needle_model_load_memory(data, (UIntPtr)data.Length, ref p, out h);
            Handle = h;
            Info = Load(st);
        }

        // The built-in demo model (see Builtin).
        Model(int threads)
        {
            Library.EnsureAbi();
            var p = Params(true, threads, 0);
            ModelHandle h;
            int st = NativeMethods.needle_model_load_builtin(ref p, out h);
            Handle = h;
            Info = Load(st);
        }

        /// <summary>Loads a container from memory (the bytes are copied).</summary>
        public static Model FromBytes(byte[] data, int threads = 0, uint depth = 0) => new Model(data, threads, depth);

        /// <summary>Loads the demo model compiled into libneedle (needle_model_load_builtin; model card
        /// models/README.md): a small Needle 2 trained to call the tools of Library.BuiltinToolsJson.
        /// threads as for the constructor (0 = all cores; negative: InvalidArgument). The caller owns
        /// the Model: Dispose it (its SafeHandle frees a forgotten one). Throws NeedleException:
        /// Unsupported when the library was built without the demo model (BuiltinToolsJson is then
        /// null) or fails the ABI check, InvalidArgument, NoMemory.</summary>
        public static Model Builtin(int threads = 0) => new Model(threads);

        static NativeMethods.ModelParams Params(bool useMmap, int threads, uint depth)
        {
            // struct_size first: needle_*_params_init writes only the caller's struct_size bytes.
            var p = new NativeMethods.ModelParams { struct_size = (uint)Marshal.SizeOf(typeof(NativeMethods.ModelParams)) };
            NativeMethods.needle_model_params_init(ref p);
            p.use_mmap = useMmap ? 1 : 0;
            p.n_threads = threads;
            p.depth = depth;
            return p;
        }

        ModelInfo Load(int status)
        {
            try
            {
                NativeMethods.Check(status);
                var i = new NativeMethods.ModelInfo { struct_size = (uint)Marshal.SizeOf(typeof(NativeMethods.ModelInfo)) };
                NativeMethods.Check(NativeMethods.needle_model_get_info(Handle, ref i));
                return new ModelInfo(i);
            }
            catch
            {
                Handle?.Dispose();
                throw;
            }
        }

        /// <summary>Encodes text with the model's tokenizer.</summary>
        public uint[] Tokenize(string text, bool addBos = false)
        {
            var bytes = Encoding.UTF8.GetBytes(text);
            var ids = new uint[bytes.Length + 8]; // a first guess; the library reports the need
            while (true)
            {
                UIntPtr n;
                int st = NativeMethods.needle_model_tokenize(Handle, bytes, (UIntPtr)bytes.Length,
                    addBos ? 1 : 0, ids, (UIntPtr)ids.Length, out n);
                if (st == (int)Status.BufferTooSmall && (int)n > ids.Length) { ids = new uint[(int)n]; continue; }
                NativeMethods.Check(st);
                Array.Resize(ref ids, (int)n);
                return ids;
            }
        }

        /// <summary>Decodes ids to text.</summary>
        public string Detokenize(uint[] ids)
        {
            UIntPtr n;
            int st = NativeMethods.needle_model_detokenize(Handle, ids, (UIntPtr)ids.Length, null, UIntPtr.Zero, out n);
            if (st != (int)Status.BufferTooSmall) NativeMethods.Check(st);
            var buf = new byte[(int)n + 1];
            NativeMethods.Check(NativeMethods.needle_model_detokenize(Handle, ids, (UIntPtr)ids.Length, buf, (UIntPtr)buf.Length, out n));
            return Encoding.UTF8.GetString(buf, 0, (int)n);
        }

        /// <summary>A new empty sequence: kvWindow -1 = the model's window, 0 = full causal, > 0 = this window.</summary>
        /// <summary>kvWindow: -1 the model's window, 0 full causal, > 0 tokens. int8Kv: an int8 KV
        /// cache (3.8x smaller at head_dim 64, logits not bit-faithful; needle.h needle_kv_type).
        /// maxTokens: positions the state can hold (0 = max_seq_len); its KV memory is sized for
        /// them and feeding past them is CONTEXT_FULL.</summary>
        public State NewState(int kvWindow = -1, bool int8Kv = false, uint maxTokens = 0) =>
            new State(this, kvWindow, int8Kv, maxTokens);

        /// <summary>Prefill scratch for chunks of up to `capacity` positions.</summary>
        public Batch NewBatch(uint capacity) => new Batch(this, capacity);

        /// <summary>Releases this reference; states and batches keep the C model alive.</summary>
        public void Dispose() => Handle.Dispose();
    }

    /// <summary>Prefill scratch; serves any state of its model, one thread at a time.</summary>
    public sealed class Batch : IDisposable
    {
        public BatchHandle Handle { get; }
        public uint Capacity { get; }

        internal Batch(Model model, uint capacity)
        {
            BatchHandle h;
            int st = NativeMethods.needle_batch_create(model.Handle, capacity, out h);
            Handle = h;
            if (st != 0) { string msg = NativeMethods.Utf8(NativeMethods.needle_last_error()); h.Dispose(); throw new NeedleException((Status)st, msg); }
            Capacity = capacity;
        }

        public void Dispose() => Handle.Dispose();
    }

    /// <summary>Generation options (defaults as needle_generate_params_init).</summary>
    public sealed class GenerateOptions
    {
        public uint MaxTokens = 128;
        public float Temperature = 0f; // 0 = greedy
        public int TopK = 0;           // 0 = all
        public float TopP = 1f;        // 1 = all
        public ulong Seed = 0;
        public bool AddBos = true;
    }

    /// <summary>Figures of one Generate call, and the text and ids streamed.</summary>
    public sealed class GenerateResult
    {
        public uint PromptTokens, GeneratedTokens;
        public StopReason StopReason;
        public double PrefillMs, DecodeMs;
        public string Text;
        public uint[] Tokens;
    }

    /// <summary>One sequence (position, history, caches). Use from one thread at a time.</summary>
    public sealed class State : IDisposable
    {
        public StateHandle Handle { get; }
        /// <summary>Floats a logits buffer needs: the model's OutVocab (needle.h has no state -> model accessor).</summary>
        public uint VocabSize { get; }

        internal State(Model model, int kvWindow, bool int8Kv, uint maxTokens)
        {
            // struct_size first: needle_*_params_init writes only the caller's struct_size bytes.
            var p = new NativeMethods.StateParams { struct_size = (uint)Marshal.SizeOf(typeof(NativeMethods.StateParams)) };
            NativeMethods.needle_state_params_init(ref p);
            p.kv_window = kvWindow;
            p.kv_type = int8Kv ? 1 : 0;
            p.max_tokens = maxTokens;
            StateHandle h;
            int st = NativeMethods.needle_state_create_ex(model.Handle, ref p, out h);
            Handle = h;
            if (st != 0) { string msg = NativeMethods.Utf8(NativeMethods.needle_last_error()); h.Dispose(); throw new NeedleException((Status)st, msg); }
            VocabSize = model.Info.OutVocab;
        }

        public void Dispose() => Handle.Dispose();

        /// <summary>Tokens fed so far.</summary>
        public uint Position => NativeMethods.needle_state_pos(Handle);

        /// <summary>Rewinds to position 0.</summary>
        public void Reset() => NativeMethods.needle_state_reset(Handle);

        /// <summary>Feeds one token; `logits` (null = skip the LM head) receives the next-token logits.</summary>
        public void Decode(uint token, float[] logits) =>
            NativeMethods.Check(NativeMethods.needle_state_decode(Handle, token, logits, (UIntPtr)(logits?.Length ?? 0)));

        /// <summary>One decode step of several states of one model together (needle_decode_many):
        /// states[i] is fed tokens[i], every weight group is decoded once for all of them, and each
        /// state gets the bits its own Decode would give. logits is null (skip the LM head) or one
        /// array per state of at least VocabSize floats (the shortest length is passed). At most the
        /// batch's capacity, each state once. Validated up front: an error changes no state.</summary>
        public static void DecodeMany(State[] states, uint[] tokens, float[][] logits, Batch batch)
        {
            if (states == null || tokens == null || batch == null || tokens.Length != states.Length ||
                (logits != null && logits.Length != states.Length))
                throw new NeedleException(Status.InvalidArgument,
                    "DecodeMany: give states, one token each, no or one logits array each, and a batch");
            int n = states.Length, width = int.MaxValue;
            var handles = new IntPtr[n];
            var pins = new GCHandle[logits == null ? 0 : n];
            var rows = logits == null ? null : new IntPtr[n];
            var refs = new bool[n];
            try
            {
                for (int i = 0; i < n; i++)
                {
                    if (states[i] == null) throw new NeedleException(Status.InvalidArgument, "DecodeMany: a null state");
                    states[i].Handle.DangerousAddRef(ref refs[i]);  // alive while the C call runs
                    handles[i] = states[i].Handle.DangerousGetHandle();
                }
                for (int i = 0; rows != null && i < n; i++)
                {
                    if (logits[i] == null) throw new NeedleException(Status.InvalidArgument, "DecodeMany: a null logits array");
                    pins[i] = GCHandle.Alloc(logits[i], GCHandleType.Pinned);
                    rows[i] = pins[i].AddrOfPinnedObject();
                    width = Math.Min(width, logits[i].Length);
                }
                NativeMethods.Check(NativeMethods.needle_decode_many(handles, tokens, (UIntPtr)n, rows,
                    (UIntPtr)(rows == null ? 0 : width), batch.Handle));
            }
            finally
            {
                foreach (var p in pins) if (p.IsAllocated) p.Free();
                for (int i = 0; i < n; i++) if (refs[i]) states[i].Handle.DangerousRelease();
            }
        }

        /// <summary>Feeds one token and returns the next-token logits.</summary>
        public float[] Decode(uint token)
        {
            var logits = new float[VocabSize];
            Decode(token, logits);
            return logits;
        }

        /// <summary>σ(confidence head) over every token fed so far; Status.Unsupported without the head.</summary>
        public float Confidence()
        {
            NativeMethods.Check(NativeMethods.needle_state_confidence(Handle, out float p));
            return p;
        }

        /// <summary>Unit contrastive embedding of every token fed so far (similarity = dot product).</summary>
        public float[] Embedding()
        {
            int st = NativeMethods.needle_state_embedding(Handle, null, UIntPtr.Zero, out UIntPtr dim);
            if (st != (int)Status.BufferTooSmall) NativeMethods.Check(st);
            var output = new float[(int)dim];
            NativeMethods.Check(NativeMethods.needle_state_embedding(Handle, output, dim, out dim));
            return output;
        }

        /// <summary>Makes this state continue exactly as `src` (same model and options).</summary>
        public void CopyFrom(State src) => NativeMethods.Check(NativeMethods.needle_state_copy(Handle, src.Handle));

        /// <summary>The state as a versioned, checksummed blob tied to the model file.</summary>
        public byte[] Save()
        {
            int st = NativeMethods.needle_state_save(Handle, null, UIntPtr.Zero, out UIntPtr len);
            if (st != (int)Status.BufferTooSmall) NativeMethods.Check(st);
            var buf = new byte[(int)len];
            NativeMethods.Check(NativeMethods.needle_state_save(Handle, buf, len, out len));
            return buf;
        }

        /// <summary>Restores a Save of the same model file and options; Status.Format (state unchanged) otherwise.</summary>
        public void Load(byte[] blob) =>
            NativeMethods.Check(NativeMethods.needle_state_load(Handle, blob, (UIntPtr)blob.Length));

        /// <summary>Feeds tokens (through `batch` if not null); `logits` (null = skip) receives the last position's logits.</summary>
        public void Prefill(uint[] tokens, Batch batch, float[] logits)
        {
            bool added = false;
            try
            {
                IntPtr b = IntPtr.Zero;
                if (batch != null) { batch.Handle.DangerousAddRef(ref added); b = batch.Handle.DangerousGetHandle(); }
                NativeMethods.Check(NativeMethods.needle_state_prefill(Handle, b, tokens, (UIntPtr)tokens.Length,
                    logits, (UIntPtr)(logits?.Length ?? 0)));
            }
            finally
            {
                if (added) batch.Handle.DangerousRelease();
            }
        }

        /// <summary>
        /// Feeds `prompt` (no chat template) and generates. `onToken(id, text)` gets each token and
        /// the text it completes (id NativeMethods.NoToken for a final U+FFFD flush); returning true
        /// stops, which is not an error (StopReason.Callback). An exception thrown by the callback
        /// stops generation and is rethrown here after the C call has returned.
        /// </summary>
        public GenerateResult Generate(string prompt, GenerateOptions options = null, Batch batch = null,
                                       Func<uint, string, bool> onToken = null)
        {
            options = options ?? new GenerateOptions();
            var p = new NativeMethods.GenerateParams { struct_size = (uint)Marshal.SizeOf(typeof(NativeMethods.GenerateParams)) };
            NativeMethods.needle_generate_params_init(ref p);
            p.max_tokens = options.MaxTokens; p.temperature = options.Temperature; p.top_k = options.TopK;
            p.top_p = options.TopP; p.seed = options.Seed; p.add_bos = options.AddBos ? 1 : 0;
            var r = new NativeMethods.GenerateResult { struct_size = (uint)Marshal.SizeOf(typeof(NativeMethods.GenerateResult)) };

            var ctx = new GenerateContext { OnToken = onToken };
            var promptBytes = Encoding.UTF8.GetBytes(prompt);
            bool added = false;
            int st;
            GCHandle user = GCHandle.Alloc(ctx); // user_data: native code sees only this handle
            try
            {
                IntPtr b = IntPtr.Zero;
                if (batch != null) { batch.Handle.DangerousAddRef(ref added); b = batch.Handle.DangerousGetHandle(); }
                st = NativeMethods.needle_generate(Handle, b, promptBytes, (UIntPtr)promptBytes.Length, ref p,
                                                   TokenTrampoline, GCHandle.ToIntPtr(user), ref r);
            }
            finally
            {
                user.Free();
                if (added) batch.Handle.DangerousRelease();
            }
            string message = st != 0 ? NativeMethods.Utf8(NativeMethods.needle_last_error()) : null;
            ctx.Failure?.Throw();
            if (st != 0 && st != (int)Status.Cancelled) throw new NeedleException((Status)st, message);
            return new GenerateResult
            {
                PromptTokens = r.prompt_tokens, GeneratedTokens = r.generated_tokens,
                StopReason = (StopReason)r.stop_reason, PrefillMs = r.prefill_ms, DecodeMs = r.decode_ms,
                Text = ctx.Text.ToString(), Tokens = ctx.Ids.ToArray(),
            };
        }

        /// <summary>What one Generate call's callback needs, reached through user_data.</summary>
        sealed class GenerateContext
        {
            public Func<uint, string, bool> OnToken;
            public readonly StringBuilder Text = new StringBuilder();
            public readonly System.Collections.Generic.List<uint> Ids = new System.Collections.Generic.List<uint>();
            public ExceptionDispatchInfo Failure;
        }

        // One delegate for the process, held in a static field so the collector never moves or
        // frees it while native code may call it.
        static readonly NativeMethods.TokenCallback TokenTrampoline = OnNativeToken;

        [MonoPInvokeCallback(typeof(NativeMethods.TokenCallback))]
        static int OnNativeToken(uint token, IntPtr text, UIntPtr len, IntPtr userData)
        {
            var ctx = (GenerateContext)GCHandle.FromIntPtr(userData).Target;
            if (ctx.Failure != null) return 1;
            try
            {
                var bytes = new byte[(int)len];
                if (bytes.Length > 0) Marshal.Copy(text, bytes, 0, bytes.Length);
                string piece = Encoding.UTF8.GetString(bytes);
                ctx.Text.Append(piece);
                if (token != NativeMethods.NoToken) ctx.Ids.Add(token);
                return ctx.OnToken != null && ctx.OnToken(token, piece) ? 1 : 0;
            }
            catch (Exception e) // never let an exception unwind into C
            {
                ctx.Failure = ExceptionDispatchInfo.Capture(e);
                return 1;
            }
        }
    }
}
