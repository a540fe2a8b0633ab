--[[
gpualloc advisory job_submit plugin (Slurm job_submit/lua).

For every submitted job that asks for GPUs (--gres=gpu:N, --gres=gpu:TYPE:N), asks a running
gpualloc service (POST /advise) which GPU type and nodes the job should get, and sets them:
job_desc.tres_per_node = "gres:gpu:<type>:<n>" and, when the service has free GPUs for it now,
job_desc.req_nodes = "<node>[,<node>...]". When the service does not answer within the timeout,
answers an error, or the job asks for no GPUs, the job is left as submitted (Slurm's default).

Configuration: gpualloc_advise.conf in the same folder as this script (key=value lines):
    url=http://127.0.0.1:8765       the service
    header_file=/etc/slurm/gpualloc.header   a file (mode 0600) holding "Authorization: Bearer <token>"
    timeout_s=1                     curl --max-time; slurmctld waits this long at most per job
    partitions=gpu,batch            optional: only jobs of these partitions (default: all)
No configuration file: the plugin does nothing.
]]

local CONF_NAME = "gpualloc_advise.conf"
local NO_VAL = 4294967294 -- 0xfffffffe and above: "not set" in 32-bit job_desc fields

local function script_dir()
    local src = debug.getinfo(1, "S").source
    return src:match("^@(.*/)") or "./"
end

local function read_conf()
    local fh = io.open(script_dir() .. CONF_NAME, "r")
    if not fh then
        return nil
    end
    local conf = { timeout_s = "1" }
    for line in fh:lines() do
        local k, v = line:match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
        if k and not line:match("^%s*#") then
            conf[k] = v
        end
    end
    fh:close()
    if not conf.url or not conf.header_file then
        return nil
    end
    return conf
end

local function quote(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function unset(v)
    return v == nil or v == slurm.NO_VAL or v == slurm.NO_VAL16 or v >= NO_VAL or v <= 0
end

-- "gres:gpu:2", "gres/gpu:v100:2", "gres:gpu:v100:2,gres:nic:1" -> count, type (or nil)
local function gpu_request(tres)
    if tres == nil then
        return nil
    end
    for item in tostring(tres):gmatch("[^,]+") do
        local rest = item:match("^gres[:/]gpu:?(.*)$")
        if rest then
            local t, n = rest:match("^([^:]+):(%d+)$")
            if t then
                return tonumber(n), t
            end
            if rest:match("^%d+$") then
                return tonumber(rest), nil
            end
            if rest == "" then
                return 1, nil
            end
            return 1, rest
        end
    end
    return nil
end

local function in_partitions(conf, partition)
    if not conf.partitions or conf.partitions == "" then
        return true
    end
    for p in conf.partitions:gmatch("[^,%s]+") do
        if p == partition then
            return true
        end
    end
    return false
end

local function ask(conf, body)
    local cmd = "curl -sS --fail --max-time " .. quote(conf.timeout_s) .. " -H @" .. quote(conf.header_file)
        .. " -H 'Content-Type: application/json' --data-binary " .. quote(body) .. " "
        .. quote(conf.url:gsub("/+$", "") .. "/advise") .. " 2>/dev/null"
    local p = io.popen(cmd, "r")
    if not p then
        return nil
    end
    local out = p:read("*a")
    p:close()
    return out
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local conf = read_conf()
    if not conf or not in_partitions(conf, job_desc.partition) then
        return slurm.SUCCESS
    end
    local per_node, gpu_type = gpu_request(job_desc.tres_per_node)
    if not per_node then
        return slurm.SUCCESS
    end
    local nodes = unset(job_desc.min_nodes) and 1 or job_desc.min_nodes
    local body = string.format('{"gpus": %d, "single_node": %s, "name": "slurm-%s"', per_node * nodes,
        nodes == 1 and "true" or "false", tostring(submit_uid))
    if gpu_type then
        body = body .. string.format(', "gpu_type": "%s"', gpu_type:gsub('[^%w%._-]', ''))
    end
    if not unset(job_desc.time_limit) then
        body = body .. string.format(', "duration_s": %d', job_desc.time_limit * 60)
    end
    body = body .. "}"
    local out = ask(conf, body)
    local gres = {}
    local order = {}
    for node, g in (out and out:match('"gres"%s*:%s*{(.-)}') or ""):gmatch('"([^"]+)"%s*:%s*"([^"]+)"') do
        gres[node] = g
        order[#order + 1] = node
    end
    if #order == 0 then
        slurm.log_info("gpualloc: no advice for job of uid %s (service silent or no answer within %s s): "
            .. "Slurm's default", tostring(submit_uid), conf.timeout_s)
        return slurm.SUCCESS
    end
    local first = gres[order[1]]
    for _, node in ipairs(order) do
        if gres[node] ~= first then
            slurm.log_info("gpualloc: advice with unequal GPUs per node ignored: Slurm's default")
            return slurm.SUCCESS
        end
    end
    job_desc.tres_per_node = "gres:" .. first
    local busy = out:match('"busy"%s*:%s*true') ~= nil
    if not busy then
        job_desc.req_nodes = table.concat(order, ",")
        job_desc.min_nodes = #order
    end
    slurm.log_info("gpualloc: job of uid %s gets %s%s", tostring(submit_uid), job_desc.tres_per_node,
        busy and " (nodes left to Slurm)" or " on " .. table.concat(order, ","))
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

slurm.log_info("gpualloc advisory job_submit plugin loaded")
return slurm.SUCCESS
