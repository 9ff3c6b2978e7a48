// Tool-calling conversations (needle.h needle_chat_*, spec tool-calling.md). Mono ships no
// System.Text.Json, so Complete returns the §7.1 envelope as the library's JSON text (keys in the
// documented order); parse it with the JSON library of your choice.
using System;
using System.Runtime.InteropServices;
using System.Text;
using Microsoft.Win32.SafeHandles;

namespace Needle
{
    /// <summary>needle_chat_params.tool_choice (NEEDLE_TOOL_CHOICE_*).</summary>
    public enum ToolChoice { Auto = 0, Required = 1, None = 2 }

    public sealed class ChatHandle : SafeHandleZeroOrMinusOneIsInvalid
    {
        public ChatHandle() : base(true) { }
        protected override bool ReleaseHandle() { NativeMethods.needle_chat_free(handle); return true; }
    }

    public static partial class NativeMethods
    {
        /// <summary>needle_chat_params, field by field.</summary>
        [StructLayout(LayoutKind.Sequential)]
        public struct ChatParams
        {
            public uint struct_size;
            public int tool_choice, kv_type, grammar, require_required, stop_needs_call, sinks;
        }

        [DllImport(Lib)] public static extern void needle_chat_params_init(ref ChatParams p);
        [DllImport(Lib)] public static extern int needle_chat_create(ModelHandle model, byte[] system, byte[] toolsJson, ref ChatParams p, out ChatHandle chat);
        [DllImport(Lib)] public static extern int needle_chat_render(ChatHandle chat, byte[] text, [In, Out] byte[] output, UIntPtr cap, out UIntPtr len);
        [DllImport(Lib)] public static extern int needle_chat_complete(ChatHandle chat, byte[] text, uint maxNewTokens, [In, Out] byte[] output, UIntPtr cap, out UIntPtr len);
        [DllImport(Lib)] public static extern void needle_chat_reset(ChatHandle chat);
        [DllImport(Lib)] public static extern void needle_chat_free(IntPtr chat);
        [DllImport(Lib)] public static extern int needle_chat_tools_json(ChatHandle chat, [In, Out] byte[] output, UIntPtr cap, out UIntPtr len);
    }

    /// <summary>Options of a Chat, one per needle_chat_params field (defaults: the library's).</summary>
    public sealed class ChatOptions
    {
        public ToolChoice ToolChoice = ToolChoice.Auto;
        public int KvType = 0;               // needle_kv_type: 0 f32, 1 int8
        public bool Grammar = true;          // constrained decoding inside <tool_call> (§6)
        public bool RequireRequired = true;  // arguments close only once every "required" key appeared
        public bool StopNeedsCall = true;    // EOS and <|im_end|> masked until a call list has closed
        public bool Sinks = true;            // the static prefix stays visible as KV sinks (§10.3)
    }

    /// <summary>One tool-calling conversation. Used by one thread at a time; Dispose frees it (the
    /// library keeps its model alive).</summary>
    public sealed class Chat : IDisposable
    {
        public const int BufferSize = 1 << 20; // bytes for one envelope
        public ChatHandle Handle { get; }
        byte[] buf; // envelope buffer, sized once

        /// <summary>system: facts for the system turn; toolsJson: a JSON array of schemas.</summary>
        public Chat(Model model, string system = "", string toolsJson = "[]", ChatOptions options = null)
        {
            var o = options ?? new ChatOptions();
            // struct_size first: needle_chat_params_init writes only the caller's struct_size bytes
            // (this mirror stops before validation and tool_index_path).
            var p = new NativeMethods.ChatParams { struct_size = (uint)Marshal.SizeOf(typeof(NativeMethods.ChatParams)) };
            NativeMethods.needle_chat_params_init(ref p);
            p.tool_choice = (int)o.ToolChoice;
            p.kv_type = o.KvType;
            p.grammar = o.Grammar ? 1 : 0;
            p.require_required = o.RequireRequired ? 1 : 0;
            p.stop_needs_call = o.StopNeedsCall ? 1 : 0;
            p.sinks = o.Sinks ? 1 : 0;
            ChatHandle h;
            int st = NativeMethods.needle_chat_create(model.Handle, NativeMethods.CString(system ?? ""),
                                                      NativeMethods.CString(string.IsNullOrEmpty(toolsJson) ? "[]" : toolsJson), ref p, out h);
            Handle = h;
            if (st != 0) { string msg = NativeMethods.Utf8(NativeMethods.needle_last_error()); h.Dispose(); throw new NeedleException((Status)st, msg); }
        }

        public void Dispose() => Handle.Dispose();

        delegate int TextCall(byte[] output, UIntPtr cap, out UIntPtr len);

        // Size query, then the write (the buffer rules of needle_chat_render).
        static string Text(TextCall call)
        {
            UIntPtr n;
            int st = call(null, UIntPtr.Zero, out n);
            if (st != (int)Status.BufferTooSmall) NativeMethods.Check(st);
            var b = new byte[(int)n + 1];
            NativeMethods.Check(call(b, (UIntPtr)b.Length, out n));
            return Encoding.UTF8.GetString(b, 0, (int)n);
        }

        /// <summary>The exact text the next Complete(text) would feed (no BOS).</summary>
        public string Render(string text)
        {
            var t = NativeMethods.CString(text);
            return Text((byte[] o, UIntPtr c, out UIntPtr n) => NativeMethods.needle_chat_render(Handle, t, o, c, out n));
        }

        /// <summary>The canonical tools JSON placed between &lt;tools&gt; and &lt;/tools&gt; (§3.3).</summary>
        public string ToolsJson => Text((byte[] o, UIntPtr c, out UIntPtr n) => NativeMethods.needle_chat_tools_json(Handle, o, c, out n));

        /// <summary>One turn on text (a query, or tool results as JSON): the envelope JSON. A failed
        /// turn is an envelope with "success":false, not an exception.</summary>
        public string Complete(string text, uint maxNewTokens = 256)
        {
            if (buf == null) buf = new byte[BufferSize];
            UIntPtr n;
            NativeMethods.Check(NativeMethods.needle_chat_complete(Handle, NativeMethods.CString(text), maxNewTokens, buf, (UIntPtr)buf.Length, out n));
            return Encoding.UTF8.GetString(buf, 0, (int)n);
        }

        /// <summary>Rewinds to the cached static prefix; tools and system stay.</summary>
        public void Reset() => NativeMethods.needle_chat_reset(Handle);
    }
}
