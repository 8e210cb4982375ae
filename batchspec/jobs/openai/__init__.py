"""OpenAI batch files in and out (`batchspec run-batch`): request.py parses and checks a request line,
batch.py reads a batch file as a job's source, response.py writes the output and error lines,
run_batch.py is the command."""
