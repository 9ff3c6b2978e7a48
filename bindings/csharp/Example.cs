// Streams generated text:  mono Example.exe [MODEL.cact] [PROMPT]
// Without a model argument it runs the demo model ($NEEDLE_DEMO_MODEL, else
// $NEEDLE_LIB_DIR/models/needle-demo.cact): the trained tool-calling demo model, prompted
// without the chat template.
using System;
using System.IO;

static class Example
{
    static int Main(string[] args)
    {
        string path = args.Length > 0 ? args[0] : Environment.GetEnvironmentVariable("NEEDLE_DEMO_MODEL");
        if (string.IsNullOrEmpty(path))
            path = Path.Combine(Environment.GetEnvironmentVariable("NEEDLE_LIB_DIR") ?? "../../build", "models", "needle-demo.cact");
        string prompt = args.Length > 1 ? args[1] : "Once upon a time";
        Console.WriteLine($"needle {Needle.Library.Version} (ABI {Needle.Library.AbiVersion}), model {path}");
        try
        {
            using (var model = new Needle.Model(path))
            using (var state = model.NewState())
            {
                var options = new Needle.GenerateOptions { MaxTokens = 32, Temperature = 0.8f, Seed = 7 };
                var stdout = Console.OpenStandardOutput();
                var r = state.Generate(prompt, options, null, (id, text) =>
                {
                    var bytes = System.Text.Encoding.UTF8.GetBytes(text); // raw UTF-8, whatever the console encoding
                    stdout.Write(bytes, 0, bytes.Length);
                    stdout.Flush();
                    return false; // keep going
                });
                Console.WriteLine($"\n[{r.PromptTokens} prompt tokens, {r.GeneratedTokens} generated, stop {r.StopReason}]");
            }
            return 0;
        }
        catch (Needle.NeedleException e)
        {
            Console.Error.WriteLine("error: " + e);
            return 1;
        }
    }
}
